//! Runs the built `rdkv-bench` end to end against real local servers, with
//! tiny counts (seconds). No timing is asserted: only that the output is
//! YCSB's, the counts add up and nothing failed.

mod common;

use std::process::Output;

use common::{run, values, workload};

/// `rdkv-server` next to `rdkv-bench`, built with the same profile: cargo
/// builds only this package's binaries for its tests.
fn build_server() {
    let server = rdkv_tests::binary("rdkv-server");
    assert!(server.is_file(), "{} missing", server.display());
}

/// `rdkv-bench ycsb` against one embedded node with 200 records of workload
/// `name` and `operations` operations, with `extra` arguments.
fn embedded_ycsb(name: &str, operations: u32, extra: &[&str]) -> (Output, String) {
    let file = workload(name);
    let operations = format!("operationcount={operations}");
    let mut args = vec![
        "ycsb",
        "--embedded",
        "1",
        "-P",
        &file,
        "-p",
        "recordcount=200",
        "-p",
        &operations,
    ];
    args.extend_from_slice(extra);
    run(&args)
}

#[test]
fn ycsb_against_an_embedded_node() {
    build_server();
    let json = tempfile::NamedTempFile::new().expect("temp file");
    let json_path = json.path().display().to_string();
    let (output, stdout) = embedded_ycsb(
        "workloada",
        500,
        &[
            "--json",
            &json_path,
            // One threshold that always holds and one that cannot: exit code 3.
            "--sla",
            "update.max>=0us,throughput<0",
        ],
    );
    assert_eq!(
        output.status.code(),
        Some(3),
        "the impossible SLA must fail the run"
    );

    // Load, then run: two [OVERALL] blocks with sane values.
    let runtimes = values(&stdout, "OVERALL", "RunTime(ms)");
    let throughputs = values(&stdout, "OVERALL", "Throughput(ops/sec)");
    assert_eq!(runtimes.len(), 2, "{stdout}");
    assert_eq!(throughputs.len(), 2);
    assert!(runtimes.iter().all(|r| *r >= 0.0));
    assert!(throughputs.iter().all(|t| *t > 0.0));
    assert_eq!(values(&stdout, "INSERT", "Return=OK"), vec![200.0]);
    let reads = values(&stdout, "READ", "Return=OK");
    let updates = values(&stdout, "UPDATE", "Return=OK");
    assert_eq!(reads.len(), 1);
    assert_eq!(updates.len(), 1);
    assert_eq!(reads[0] + updates[0], 500.0);
    assert_eq!(values(&stdout, "READ", "Operations"), reads);
    for line in [
        "[READ], 50thPercentileLatency(us), ",
        "[READ], 99.9PercentileLatency(us), ",
        "[UPDATE], AverageLatency(us), ",
    ] {
        assert!(stdout.contains(line), "missing {line:?}");
    }
    assert!(!stdout.contains("Return=ERROR"), "errors in:\n{stdout}");
    assert!(
        !stdout.contains("Return=NOT_FOUND"),
        "missing records in:\n{stdout}"
    );
    assert!(stdout.contains("pass update.max>=0us"), "{stdout}");
    assert!(stdout.contains("FAIL throughput<0"), "{stdout}");

    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json.path()).expect("json written"))
            .expect("valid JSON");
    let results = report["results"].as_array().expect("results");
    assert_eq!(results.len(), 2);
    assert_eq!(results[1]["phase"], "run");
    assert_eq!(results[1]["operations"], 500);
    assert_eq!(report["sla_passed"], false);
}

#[test]
fn ycsb_batches_a_threads_reads_with_rdkv_shm_batch() {
    build_server();
    // Workload C: every group of 8 in flight is all reads, so each is one
    // batch (`get_many_into`); each read is still checked and counted.
    let (output, stdout) = embedded_ycsb(
        "workloadc",
        500,
        &["--target", "rdkv-shm-batch", "--concurrency", "8"],
    );
    assert!(
        output.status.success(),
        "exit {:?}\n{stdout}",
        output.status
    );
    assert!(stdout.contains("# rdkv-shm-batch run phase"), "{stdout}");
    assert_eq!(
        values(&stdout, "READ", "Return=OK"),
        vec![500.0],
        "{stdout}"
    );
    assert_eq!(values(&stdout, "READ", "Operations"), vec![500.0]);
    assert!(!stdout.contains("Return=ERROR"), "{stdout}");
    assert!(!stdout.contains("Return=NOT_FOUND"), "{stdout}");
}

#[test]
fn ycsb_compares_rdkv_with_redis() {
    let Some(_) = rdkv_bench::embedded::find_on_path("redis-server") else {
        rdkv_tests::skip::skip(
            "ycsb_compares_rdkv_with_redis",
            "redis-server is not on PATH (apt-get install redis-server; .ci/run does)",
        );
        return;
    };
    build_server();
    // Workload E: inserts and scans, so both drivers' scans run too.
    let (output, stdout) = embedded_ycsb(
        "workloade",
        300,
        &[
            "--start-redis",
            "-p",
            "maxscanlength=10",
            "--target",
            "rdkv",
            "--target",
            "redis",
        ],
    );
    assert!(output.status.success(), "exit {:?}", output.status);
    for target in ["rdkv-auto", "redis"] {
        assert!(
            stdout.contains(&format!("# {target} load phase")),
            "{stdout}"
        );
        assert!(
            stdout.contains(&format!("# {target} run phase")),
            "{stdout}"
        );
    }
    assert_eq!(values(&stdout, "OVERALL", "RunTime(ms)").len(), 4);
    let scans = values(&stdout, "SCAN", "Return=OK");
    let inserts = values(&stdout, "INSERT", "Return=OK");
    // Per target: 200 loaded, then run-phase inserts; scans + inserts = 300.
    assert_eq!(scans.len(), 2, "{stdout}");
    assert_eq!(inserts.len(), 4);
    assert_eq!(inserts[0], 200.0);
    assert_eq!(inserts[2], 200.0);
    assert_eq!(scans[0] + inserts[1], 300.0);
    assert_eq!(scans[1] + inserts[3], 300.0);
    assert!(!stdout.contains("Return=ERROR"), "{stdout}");
    assert!(
        stdout.contains("| metric | rdkv-auto | redis | rdkv-auto/redis |"),
        "{stdout}"
    );
    assert!(stdout.contains("| throughput (ops/s) |"), "{stdout}");
    assert!(stdout.contains("| SCAN p99 (us) |"), "{stdout}");
}

#[test]
fn ycsb_reaches_rdkv_through_its_resp_port() {
    build_server();
    // Workload A (reads and updates) over the leader's RESP port with the
    // redis driver, the server flag passed through to the node.
    let (output, stdout) = embedded_ycsb(
        "workloada",
        300,
        &[
            "--target",
            "rdkv-resp",
            "--server-arg=--resp-read-consistency=lease",
        ],
    );
    assert!(
        output.status.success(),
        "exit {:?}\n{stdout}",
        output.status
    );
    assert!(stdout.contains("# rdkv-resp load phase"), "{stdout}");
    assert_eq!(values(&stdout, "INSERT", "Return=OK"), vec![200.0]);
    let reads = values(&stdout, "READ", "Return=OK");
    let updates = values(&stdout, "UPDATE", "Return=OK");
    assert_eq!(reads[0] + updates[0], 300.0, "{stdout}");
    // Every record read back was found: the RESP port serves what it wrote.
    assert!(!stdout.contains("Return=NOT_FOUND"), "{stdout}");
    assert!(!stdout.contains("Return=ERROR"), "{stdout}");

    // A scan workload says why it cannot run rather than failing mid-run.
    let (output, stdout) = embedded_ycsb("workloade", 10, &["--target", "rdkv-resp"]);
    assert!(!output.status.success(), "{stdout}");
}

#[test]
fn bad_input_gets_clear_errors() {
    let (output, _) = run(&["ycsb", "--sla", "read.p99<500", "-p", "recordcount=10"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("needs a unit"), "{stderr}");

    let (output, _) = run(&["ycsb", "-p", "recordcount=ten"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("property recordcount = \"ten\"")
            && stderr.contains("non-negative integer"),
        "{stderr}"
    );

    let (output, _) = run(&["ycsb", "-P", "/nonexistent/workload"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("/nonexistent/workload"), "{stderr}");

    let (output, _) = run(&[
        "ycsb",
        "-p",
        "recordcount=10",
        "--transport",
        "rdma",
        "--endpoints",
        "127.0.0.1:1",
    ]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no RDMA transport"), "{stderr}");
}

/// A build without the feature `etcd` refuses its flags and says how to
/// get them, rather than ignoring them.
#[cfg(not(feature = "etcd"))]
#[test]
fn etcd_flags_need_the_etcd_feature() {
    let target = ["ycsb", "-p", "recordcount=10", "--target", "etcd"];
    let start = ["ycsb", "-p", "recordcount=10", "--start-etcd", "3"];
    for args in [&target[..], &start[..]] {
        let (output, _) = run(args);
        assert!(!output.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("--features etcd") && stderr.contains("protoc"),
            "{args:?}: {stderr}"
        );
    }
}
