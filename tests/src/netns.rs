//! Real network partitions: each node in its own network namespace, joined
//! to the test's namespace by a veth pair on a bridge, so a partition is a
//! routing fact (blackhole routes inside the namespaces), not a promise the
//! server keeps. Needs root and `ip` (iproute2); [`Lab::available`] says
//! whether this host can. Everything is on a private bridge: no traffic
//! leaves the machine.
//!
//! Names carry the test process's pid so that labs of concurrent test
//! processes never collide, and labs left behind by a killed process are
//! removed by the next one.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, bail};

/// One isolated network: a bridge in the test's namespace and a namespace
/// per node. Removed on drop.
#[derive(Debug)]
pub struct Lab {
    pid: u32,
    subnet: [u8; 3],
    bridge: String,
    nodes: Vec<u64>,
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn ip_output(args: &[&str]) -> String {
    Command::new("ip")
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Whether `name` (`<prefix><pid><sep>...`) was made by a test process
/// that no longer exists.
fn owner_gone(name: &str, prefix: &str, sep: char) -> bool {
    name.strip_prefix(prefix)
        .and_then(|rest| rest.split(sep).next())
        .and_then(|pid| pid.parse::<u32>().ok())
        .is_some_and(|pid| !pid_alive(pid))
}

/// Removes namespaces and bridges of test processes that no longer exist.
fn remove_stale() {
    for line in ip_output(&["netns", "list"]).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        if owner_gone(name, "rdkv-", '-') {
            let _ = ip(&["netns", "del", name]);
        }
    }
    for line in ip_output(&["-o", "link", "show", "type", "bridge"]).lines() {
        if let Some(name) = line.split(':').nth(1).map(str::trim)
            && owner_gone(name, "rk", 'b')
        {
            let _ = ip(&["link", "del", name]);
        }
    }
}

impl Lab {
    /// Whether network namespaces can be made here (root, iproute2).
    pub fn available() -> bool {
        static PROBE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *PROBE.get_or_init(|| {
            let name = format!("rdkv-{}-probe", std::process::id());
            let made = ip(&["netns", "add", &name]).is_ok();
            if made {
                let _ = ip(&["netns", "del", &name]);
            }
            made
        })
    }

    /// A lab for nodes `1..=n`.
    pub fn create(n: u64) -> Result<Lab> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        remove_stale();
        let pid = std::process::id();
        // 10.<100 + pid % 100>.<k>.0/24: one subnet per lab of this process.
        let second = u8::try_from(100 + pid % 100).unwrap_or(100);
        let used = ip_output(&["-o", "-4", "addr", "show"]);
        let third = loop {
            let k = NEXT.fetch_add(1, Ordering::Relaxed) % 250 + 1;
            let k = u8::try_from(k).unwrap_or(1);
            if !used.contains(&format!("10.{second}.{k}.")) {
                break k;
            }
        };
        let mut lab = Lab {
            pid,
            subnet: [10, second, third],
            bridge: format!("rk{pid}b{third}"),
            nodes: Vec::new(),
        };
        ip(&["link", "add", &lab.bridge, "type", "bridge"])?;
        let gateway = format!("{}/24", lab.host_ip());
        ip(&["addr", "add", &gateway, "dev", &lab.bridge])?;
        ip(&["link", "set", &lab.bridge, "up"])?;
        for id in 1..=n {
            lab.add_node(id)?;
        }
        Ok(lab)
    }

    fn host_ip(&self) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, 1)
    }

    /// The address node `id` listens on.
    pub fn node_ip(&self, id: u64) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, u8::try_from(10 + id).unwrap_or(255))
    }

    pub fn namespace(&self, id: u64) -> String {
        format!("rdkv-{}-{}-n{id}", self.pid, self.subnet[2])
    }

    fn veth(&self, id: u64) -> String {
        format!("rk{}v{}n{id}", self.pid % 100_000, self.subnet[2])
    }

    /// Adds node `id` (a namespace wired to the bridge).
    pub fn add_node(&mut self, id: u64) -> Result<()> {
        let ns = self.namespace(id);
        let veth = self.veth(id);
        ip(&["netns", "add", &ns])?;
        self.nodes.push(id);
        ip(&[
            "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ])?;
        ip(&["link", "set", &veth, "master", &self.bridge, "up"])?;
        let addr = format!("{}/24", self.node_ip(id));
        ip(&[
            "netns", "exec", &ns, "ip", "addr", "add", &addr, "dev", "eth0",
        ])?;
        ip(&["netns", "exec", &ns, "ip", "link", "set", "eth0", "up"])?;
        ip(&["netns", "exec", &ns, "ip", "link", "set", "lo", "up"])?;
        Ok(())
    }

    /// Cuts traffic between every pair of nodes in different groups, both
    /// directions (nodes in no group keep talking to everyone). The test's
    /// own namespace (clients) still reaches every node.
    pub fn partition(&self, groups: &[&[u64]]) -> Result<()> {
        self.heal()?;
        for (i, a_group) in groups.iter().enumerate() {
            for b_group in groups.iter().skip(i + 1) {
                for &a in *a_group {
                    for &b in *b_group {
                        self.blackhole(a, b)?;
                        self.blackhole(b, a)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn blackhole(&self, from: u64, to: u64) -> Result<()> {
        let route = format!("{}/32", self.node_ip(to));
        ip(&[
            "netns",
            "exec",
            &self.namespace(from),
            "ip",
            "route",
            "add",
            "blackhole",
            &route,
        ])
    }

    /// Removes every partition.
    pub fn heal(&self) -> Result<()> {
        for &id in &self.nodes {
            ip(&[
                "netns",
                "exec",
                &self.namespace(id),
                "ip",
                "route",
                "flush",
                "type",
                "blackhole",
            ])?;
        }
        Ok(())
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for &id in &self.nodes {
            let _ = ip(&["netns", "del", &self.namespace(id)]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}
