//! redis-py, the Python Redis client, against rdkv's RESP port as a user
//! installs it today: redis-py 8 from PyPI (in a virtualenv this test
//! creates), at its default settings (RESP3) and with `protocol=2`, through
//! every node of a 3-node cluster with a token. The checks themselves are
//! in `tests/python/redis_py_check.py`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use rdkv_tests::{Cluster, Intent, LEADER_TIMEOUT, check, eventually};

const TEST_LIMIT: Duration = Duration::from_secs(300);
const TOKEN: &str = "s3cret";
/// The redis-py this test installs: the major version users get today.
const REDIS_PY: &str = "redis>=8,<9";

fn venv_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("redis-py-venv")
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python/redis_py_check.py")
}

fn cluster_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python/redis_cluster_check.py")
}

fn shards_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python/redis_shards_check.py")
}

fn run(command: &mut Command) -> Result<String> {
    let output = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    ensure!(
        output.status.success(),
        "{command:?} failed ({}): {text}",
        output.status
    );
    Ok(text)
}

/// Held while the virtualenv is checked or made: the tests of this file
/// run at once, and two `python3 -m venv` of one directory collide.
static VENV_SETUP: Mutex<()> = Mutex::new(());

/// The virtualenv's python with redis-py 8 installed, made on first use.
fn python_with_redis_py() -> Result<PathBuf> {
    let _setup = VENV_SETUP.lock().unwrap_or_else(PoisonError::into_inner);
    let venv = venv_dir();
    let python = venv.join("bin/python");
    let installed = Command::new(&python)
        .args([
            "-c",
            "import redis, sys; sys.exit(redis.__version__.split('.')[0] != '8')",
        ])
        .status()
        .is_ok_and(|s| s.success());
    if !installed {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        run(Command::new(venv.join("bin/pip")).args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            REDIS_PY,
        ]))?;
    }
    Ok(python)
}

/// The virtualenv's python, or `None` after a visible skip of `test`.
async fn python_or_skip(test: &str) -> Result<Option<PathBuf>> {
    match tokio::task::spawn_blocking(python_with_redis_py).await? {
        Ok(python) => Ok(Some(python)),
        Err(e) => {
            rdkv_tests::skip::skip(
                test,
                &format!(
                    "no python3 virtualenv with redis-py from PyPI ({e:#}); .ci/run installs python3-venv"
                ),
            );
            Ok(None)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_8_works_at_its_defaults_and_with_resp2() -> Result<()> {
    let Some(python) = python_or_skip("redis_py_8_works_at_its_defaults_and_with_resp2").await?
    else {
        return Ok(());
    };
    let mut cluster = Cluster::start_with(3, &["--token", TOKEN])?;
    check(&mut cluster, TEST_LIMIT, async |cluster| {
        cluster.serving_client(TOKEN).await?;
        let addrs: Vec<String> = cluster
            .nodes
            .values()
            .map(|n| n.resp_addr.to_string())
            .collect();
        for protocol in ["default", "2"] {
            let mut command = Command::new(&python);
            command.arg(script()).args([protocol, TOKEN]).args(&addrs);
            let out = tokio::task::spawn_blocking(move || run(&mut command)).await??;
            eprintln!("{}", out.trim());
        }
        Ok(())
    })
    .await
}

/// redis-py's `RedisCluster` against a 3-node (single-shard) cluster: it
/// finds the leader by CLUSTER SLOTS and routes itself; plain connections
/// check the views, MOVED and CROSSSLOT (docs/sharding.md, section 7).
/// (`redis-benchmark --cluster` refuses a cluster of one master: "Invalid
/// cluster: 1 node(s)"; it runs against several shards, below.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_aware_redis_clients_route_themselves() -> Result<()> {
    let Some(python) = python_or_skip("cluster_aware_redis_clients_route_themselves").await? else {
        return Ok(());
    };
    let mut cluster = Cluster::start_with(3, &["--token", TOKEN])?;
    cluster.set_client_auth(Some(TOKEN), None);
    check(&mut cluster, TEST_LIMIT, async |cluster| {
        cluster.serving_client(TOKEN).await?;
        let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
        let resp_of = |id: u64| -> Result<String> { Ok(cluster.node(id)?.resp_addr.to_string()) };
        let mut addrs = vec![resp_of(leader)?];
        for id in cluster.nodes.keys().filter(|id| **id != leader) {
            addrs.push(resp_of(*id)?);
        }
        let mut command = Command::new(&python);
        command.arg(cluster_script()).arg(TOKEN).args(&addrs);
        let out = tokio::task::spawn_blocking(move || run(&mut command)).await??;
        eprintln!("{}", out.trim());

        Ok(())
    })
    .await
}

/// Redis clients against 3 nodes hosting 3 shards of 2 replicas each
/// (docs/sharding.md, section 7): a plain redis-py connection to one node
/// is answered for keys of every shard, multi-key commands split per
/// shard, KEYS/SCAN/DBSIZE/FLUSHDB over every shard; `RedisCluster` routes
/// itself by every node's CLUSTER SLOTS; connections in cluster mode get
/// CROSSSLOT and MOVED; `redis-benchmark --cluster` completes and the keys
/// it wrote are readable (`tests/python/redis_shards_check.py`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_clients_work_against_several_shards() -> Result<()> {
    const TEST: &str = "redis_clients_work_against_several_shards";
    let Some(python) = python_or_skip(TEST).await? else {
        return Ok(());
    };
    let benchmark_installed = Command::new("redis-benchmark")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !benchmark_installed {
        rdkv_tests::skip::skip(TEST, "redis-benchmark not installed (.ci/run installs it)");
        return Ok(());
    }
    let flags = ["--shards", "3", "--replicas", "2", "--region-mib", "16"];
    let mut cluster = Cluster::start_with(3, &flags)?;
    check(&mut cluster, TEST_LIMIT, async |cluster| {
        // Keys of every shard written through the map: each shard has a
        // leader its members know.
        let client = cluster.client(Intent::Any)?;
        eventually(LEADER_TIMEOUT, "a leader in every shard", async || {
            for i in 0..30 {
                client.put(format!("probe-{i}"), "x").await?;
            }
            Ok(())
        })
        .await?;
        // RESP forwards over, and CLUSTER views list, the nodes the map
        // names with their addresses: wait until each published its own.
        let ids: Vec<u64> = cluster.nodes.keys().copied().collect();
        eventually(
            LEADER_TIMEOUT,
            "every node's addresses in the map",
            async || rdkv_tests::shard_view::agreed_map(cluster, &ids).await,
        )
        .await?;
        let addrs: Vec<String> = cluster
            .nodes
            .values()
            .map(|node| node.resp_addr.to_string())
            .collect();
        let mut command = Command::new(&python);
        command
            .arg(shards_script())
            .args(["clients", "3", "2"])
            .args(&addrs);
        let out = tokio::task::spawn_blocking(move || run(&mut command)).await??;
        eprintln!("{}", out.trim());

        let first = cluster.node(1)?.resp_addr;
        let mut benchmark = Command::new("redis-benchmark");
        benchmark
            .args(["--cluster", "-h", &first.ip().to_string()])
            .args(["-p", &first.port().to_string()])
            .args(["-t", "set,get", "-n", "2000", "-q"]);
        let out = tokio::task::spawn_blocking(move || run(&mut benchmark)).await??;
        for test in ["SET", "GET"] {
            let done = out
                .split(['\r', '\n'])
                .any(|l| l.trim().starts_with(test) && l.contains("requests per second"));
            ensure!(done, "no {test} result: {out}");
        }
        ensure!(!out.contains("rror"), "errors: {out}");
        let mut command = Command::new(&python);
        command
            .arg(shards_script())
            .args(["bench-keys", &first.to_string()]);
        let out = tokio::task::spawn_blocking(move || run(&mut command)).await??;
        eprintln!("{}", out.trim());
        Ok(())
    })
    .await
}
