//! The stock Redis tools against a 3-node cluster's RESP ports:
//! `redis-benchmark -t set,get,incr,mset -n 20000 -q` completes without
//! errors, what it wrote is readable with the native client, and `redis-cli`
//! works through a follower. The tools come from the Debian package
//! `redis-tools` (`.ci/run` installs it); without them the test is skipped,
//! except under CI, where their absence fails it.

use std::process::Command;

use anyhow::{Context, Result, ensure};
use rdkv_tests::{Cluster, Intent, check_with_leader};

const REQUESTS: u64 = 20_000;

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn run(tool: &str, args: &[String]) -> Result<String> {
    let output = Command::new(tool)
        .args(args)
        .output()
        .with_context(|| format!("running {tool}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        output.status.success(),
        "{tool} {args:?} failed ({}): {stdout}{stderr}",
        output.status
    );
    Ok(stdout + &stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_benchmark_and_redis_cli_work_against_a_cluster() -> Result<()> {
    if !have("redis-benchmark") || !have("redis-cli") {
        rdkv_tests::skip::skip(
            "redis_benchmark_and_redis_cli_work_against_a_cluster",
            "redis-benchmark or redis-cli not installed (apt-get install redis-tools; .ci/run does)",
        );
        return Ok(());
    }
    let mut cluster = Cluster::start(3)?;
    check_with_leader(&mut cluster, 300, async |cluster, leader| {
        let follower = *cluster
            .nodes
            .keys()
            .find(|id| **id != leader)
            .context("no follower")?;
        let at = |id: u64| -> Result<Vec<String>> {
            let addr = cluster.node(id)?.resp_addr;
            Ok(vec![
                "-h".into(),
                addr.ip().to_string(),
                "-p".into(),
                addr.port().to_string(),
            ])
        };
        let mut args = at(leader)?;
        args.extend(
            ["-t", "set,get,incr,mset", "-n", &REQUESTS.to_string(), "-q"].map(str::to_owned),
        );
        let out = tokio::task::spawn_blocking(move || run("redis-benchmark", &args)).await??;
        for test in ["SET", "GET", "INCR", "MSET"] {
            let done = out
                .split(['\r', '\n'])
                .map(str::trim)
                .any(|l| l.starts_with(test) && l.contains("requests per second"));
            ensure!(done, "no {test} result: {out}");
        }
        ensure!(
            !out.contains("ERR") && !out.contains("rror"),
            "errors: {out}"
        );
        // What it wrote, through the native client.
        let client = cluster.client(Intent::Any)?;
        let counter = client
            .get("counter:__rand_int__")
            .await?
            .context("the INCR counter is missing")?;
        ensure!(
            counter.value.as_ref() == REQUESTS.to_string().as_bytes(),
            "counter {:?}",
            counter.value
        );
        let key = client
            .get("key:__rand_int__")
            .await?
            .context("the SET key is missing")?;
        ensure!(key.value.as_ref() == b"VXK", "key {:?}", key.value);
        // redis-cli through a follower: the write is forwarded to the leader.
        let mut args = at(follower)?;
        args.extend(["SET", "from-cli", "hello"].map(str::to_owned));
        let out = tokio::task::spawn_blocking(move || run("redis-cli", &args)).await??;
        ensure!(out.trim() == "OK", "{out}");
        let mut args = at(follower)?;
        args.extend(["GET", "from-cli"].map(str::to_owned));
        let out = tokio::task::spawn_blocking(move || run("redis-cli", &args)).await??;
        ensure!(out.trim() == "hello", "{out}");
        Ok(())
    })
    .await
}
