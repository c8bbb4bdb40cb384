//! The `rdkvctl` binary against a real 1-node cluster (with a token): what
//! each command prints, in which format, and that failures print only on
//! stderr and exit non-zero.

use std::process::Output;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use rdkv_tests::{Cluster, binary, check, eventually, free_port, rdkvctl, rdkvctl_ok};

const TOKEN: &str = "s3cret";

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs a command that must succeed; returns its stdout.
async fn ok(endpoint: &str, args: &[&str]) -> Result<String> {
    let mut full = vec!["--endpoints", endpoint, "--token", TOKEN];
    full.extend_from_slice(args);
    let out = rdkvctl_ok(&full, &[]).await?;
    ensure!(
        out.stderr.is_empty(),
        "rdkvctl {args:?} wrote to stderr: {:?}",
        text(&out.stderr)
    );
    Ok(text(&out.stdout))
}

/// Checks a failed run: non-zero exit, `Error: ...` on stderr, nothing on
/// stdout. Returns stderr.
fn failed(what: &str, out: &Output) -> Result<String> {
    let stderr = text(&out.stderr);
    ensure!(!out.status.success(), "{what}: exited 0");
    ensure!(
        out.stdout.is_empty(),
        "{what}: printed on stdout: {:?}",
        text(&out.stdout)
    );
    ensure!(stderr.starts_with("Error: "), "{what}: stderr {stderr:?}");
    Ok(stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdkvctl_against_one_node() -> Result<()> {
    let mut cluster = Cluster::start_with(1, &["--token", TOKEN])?;
    // Built before the clock of the test starts (cargo may be slow).
    tokio::task::spawn_blocking(|| binary("rdkvctl")).await?;
    check(&mut cluster, Duration::from_secs(90), async |cluster| {
        let node = cluster.node(1)?;
        let ep = node.client_addr.to_string();
        let peer = node.peer_addr.to_string();
        let ep = ep.as_str();

        // The node may still be starting: wait for the first put.
        let put = eventually(Duration::from_secs(20), "rdkvctl put", async || {
            ok(ep, &["put", "a", "1"]).await
        })
        .await?;
        ensure!(put == "OK\n", "put printed {put:?}");
        ensure!(ok(ep, &["get", "a"]).await? == "1\n");
        ensure!(ok(ep, &["get", "a", "--consistency", "linearizable"]).await? == "1\n");
        ensure!(ok(ep, &["get", "a", "--consistency", "local"]).await? == "1\n");
        let json = ok(ep, &["get", "a", "-w", "json"]).await?;
        ensure!(
            json.starts_with('{') && json.contains("\"value\":\"1\"") && json.ends_with("}\n"),
            "get -w json printed {json:?}"
        );
        ensure!(ok(ep, &["del", "a"]).await? == "1\n");
        ensure!(
            ok(ep, &["get", "a"]).await?.is_empty(),
            "absent key printed"
        );
        ensure!(ok(ep, &["del", "a"]).await? == "0\n");
        // RDKV_ENDPOINTS and RDKV_TOKEN stand in for the flags.
        let out = rdkvctl(
            &["put", "b", "two words"],
            &[("RDKV_ENDPOINTS", ep), ("RDKV_TOKEN", TOKEN)],
        )
        .await?;
        ensure!(
            out.status.success() && text(&out.stdout) == "OK\n",
            "{out:?}"
        );
        ensure!(ok(ep, &["get", "b"]).await? == "two words\n");

        // TTLs: PTTL's codes for no TTL and absent; what is left, which is
        // at most the TTL given; --ttl with a bad duration is refused.
        ensure!(ok(ep, &["ttl", "b"]).await? == "-1\n");
        ensure!(ok(ep, &["ttl", "nothing"]).await? == "-2\n");
        ensure!(ok(ep, &["put", "t", "v", "--ttl", "1h"]).await? == "OK\n");
        let left: u64 = ok(ep, &["ttl", "t"]).await?.trim().parse()?;
        ensure!(left <= 3_600_000 && left > 3_000_000, "ttl printed {left}");
        let json = ok(ep, &["ttl", "t", "-w", "json"]).await?;
        ensure!(
            json.contains("\"ttl_ms\":") && json.contains("\"deadline_unix_ms\":1"),
            "ttl -w json printed {json:?}"
        );
        let bad = [
            "--endpoints",
            ep,
            "--token",
            TOKEN,
            "put",
            "t",
            "v",
            "--ttl",
            "soon",
        ];
        let out = rdkvctl(&bad, &[]).await?;
        ensure!(
            !out.status.success() && text(&out.stderr).contains("soon"),
            "a bad --ttl was accepted: {out:?}"
        );
        ensure!(ok(ep, &["put", "t", "v", "--ttl", "1ms"]).await? == "OK\n");
        ensure!(
            ok(ep, &["get", "t"]).await?.is_empty(),
            "a key with a TTL under the expiry margin is never served"
        );

        // Scan: key and value lines in key order; --end is exclusive.
        for (k, v) in [("s/2", "two"), ("s/1", "one"), ("s/3", "three")] {
            ok(ep, &["put", k, v]).await?;
        }
        let scanned = ok(ep, &["scan", "s/", "--end", "s/3"]).await?;
        ensure!(
            scanned == "s/1\none\ns/2\ntwo\n",
            "scan printed {scanned:?}"
        );
        let scanned = ok(ep, &["scan", "s/2", "--limit", "5", "-w", "table"]).await?;
        ensure!(
            scanned.lines().count() == 6 && scanned.contains("| s/2 ") && scanned.contains("three"),
            "scan -w table printed {scanned:?}"
        );
        let json = ok(ep, &["scan", "s/", "--limit", "1", "-w", "json"]).await?;
        ensure!(
            json.contains("\"count\":1") && json.contains("\"key\":\"s/1\""),
            "scan -w json printed {json:?}"
        );

        // Status: one JSON array with this node as the leader.
        let status = ok(ep, &["endpoint", "status", "-w", "json"]).await?;
        for needle in [
            "[{".to_owned(),
            format!("\"endpoint\":\"{ep}\""),
            "\"id\":1".to_owned(),
            "\"role\":\"leader\"".to_owned(),
            "\"leader_id\":1".to_owned(),
            "\"live_keys\":4".to_owned(),
        ] {
            ensure!(status.contains(&needle), "status lacks {needle}: {status}");
        }
        let table = ok(ep, &["endpoint", "status", "-w", "table"]).await?;
        ensure!(
            table.contains("ENDPOINT") && table.contains(ep) && table.contains("leader"),
            "{table}"
        );
        let simple = ok(ep, &["endpoint", "status", "--cluster"]).await?;
        ensure!(
            simple.starts_with(ep) && simple.lines().count() == 1,
            "{simple}"
        );
        let health = ok(ep, &["endpoint", "health"]).await?;
        ensure!(health.contains("is healthy"), "{health}");

        // Members: one voter, with both its addresses.
        let members = ok(ep, &["member", "list"]).await?;
        ensure!(
            members == format!("1, {peer}, {ep}, false\n"),
            "member list printed {members:?}"
        );
        let members = ok(ep, &["member", "list", "-w", "json"]).await?;
        ensure!(
            members.contains("\"id\":1") && members.contains("\"is_learner\":false"),
            "{members}"
        );

        let moved = ok(ep, &["move-leader", "1"]).await?;
        ensure!(moved.contains("member 1"), "{moved}");

        let dir = tempfile::tempdir()?;
        let file = dir.path().join("snap.bin");
        let file_arg = file.to_str().context("temp path")?;
        let saved = ok(ep, &["snapshot", "save", file_arg]).await?;
        ensure!(saved.starts_with("Snapshot saved"), "{saved}");
        ensure!(std::fs::metadata(&file)?.len() > 0, "empty snapshot file");

        // ---- failures ----------------------------------------------------
        // Unreachable endpoint: nothing is listening on that port.
        let closed = format!("127.0.0.1:{}", free_port("127.0.0.1"));
        for args in [
            vec!["get", "a"],
            vec!["put", "a", "1"],
            vec!["del", "a"],
            vec!["member", "list"],
            vec!["endpoint", "status"],
            vec!["endpoint", "status", "-w", "json"],
        ] {
            let mut full = vec!["--endpoints", closed.as_str(), "--timeout", "1s"];
            full.extend_from_slice(&args);
            let out = rdkvctl(&full, &[]).await?;
            let stderr = failed(&format!("{args:?} against {closed}"), &out)?;
            ensure!(stderr.contains(&closed), "{args:?}: {stderr}");
        }
        // endpoint health reports the unhealthy endpoint as its output
        // (as etcdctl does), on stdout, and still fails.
        let out = rdkvctl(
            &[
                "--endpoints",
                &closed,
                "--timeout",
                "1s",
                "endpoint",
                "health",
            ],
            &[],
        )
        .await?;
        ensure!(!out.status.success(), "health of a dead endpoint exited 0");
        ensure!(text(&out.stdout).contains("is unhealthy"), "{out:?}");
        ensure!(text(&out.stderr).starts_with("Error: "), "{out:?}");

        // No token, wrong token: refused by the node.
        for token in [None, Some("wrong")] {
            let mut full = vec!["--endpoints", ep, "--timeout", "2s"];
            if let Some(t) = token {
                full.extend_from_slice(&["--token", t]);
            }
            full.extend_from_slice(&["get", "b"]);
            let out = rdkvctl(&full, &[]).await?;
            let stderr = failed(&format!("token {token:?}"), &out)?;
            ensure!(
                stderr.contains("Unauthenticated"),
                "token {token:?}: {stderr}"
            );
            ensure!(!stderr.contains(TOKEN), "the error leaks the token");
        }
        // Membership errors and usage errors.
        let out = rdkvctl(
            &["--endpoints", ep, "--token", TOKEN, "member", "remove", "9"],
            &[],
        )
        .await?;
        failed("member remove 9", &out)?;
        let out = rdkvctl(&["--endpoints", ep, "frobnicate"], &[]).await?;
        ensure!(!out.status.success() && out.stdout.is_empty(), "{out:?}");

        // The node is unaffected.
        ensure!(ok(ep, &["get", "b"]).await? == "two words\n");
        Ok(())
    })
    .await
}
