//! `rdkv-bench ycsb --target etcd --start-etcd 3` end to end: a local
//! 3-member etcd cluster of real `etcd` processes, tiny counts. No timing
//! is asserted: only that every operation ran and none failed.
//!
//! Built only with the feature (`required-features` in bench/Cargo.toml;
//! `cargo test -p rdkv-bench --features etcd --test etcd`), as etcd-client
//! needs protoc. The `rdkv-bench` it runs must be this build's: a test
//! that builds the workspace's binaries (ycsb.rs, through
//! `rdkv_tests::binary`) replaces it with one without the feature, so in
//! one `cargo test` this test must run first (cargo runs test files in
//! name order).

mod common;

use common::{run, values, workload};

#[test]
fn ycsb_against_a_started_etcd_cluster() {
    let etcd_bin = std::env::var_os("ETCD_BIN").map(std::path::PathBuf::from);
    if etcd_bin
        .or_else(|| rdkv_bench::embedded::find_on_path("etcd"))
        .is_none()
    {
        rdkv_tests::skip::skip(
            "ycsb_against_a_started_etcd_cluster",
            "etcd is not on PATH (apt-get install etcd-server; .ci/run does)",
        );
        return;
    }
    let json = tempfile::NamedTempFile::new().expect("temp file");
    let json_path = json.path().display().to_string();
    let file = workload("workloada");
    // Workload A with a tenth of its reads as short scans, so the driver's
    // range reads run too.
    let (output, stdout) = run(&[
        "ycsb",
        "--target",
        "etcd",
        "--start-etcd",
        "3",
        "-P",
        &file,
        "-p",
        "recordcount=200",
        "-p",
        "operationcount=500",
        "-p",
        "readproportion=0.4",
        "-p",
        "scanproportion=0.1",
        "-p",
        "maxscanlength=10",
        "--concurrency",
        "4",
        "--json",
        &json_path,
    ]);
    assert!(output.status.success(), "exit {:?}", output.status);
    assert!(stdout.contains("# etcd load phase"), "{stdout}");
    assert!(stdout.contains("# etcd run phase"), "{stdout}");
    assert_eq!(values(&stdout, "INSERT", "Return=OK"), vec![200.0]);
    let [reads, updates, scans] = ["READ", "UPDATE", "SCAN"].map(|op| {
        let ok = values(&stdout, op, "Return=OK");
        assert_eq!(ok.len(), 1, "{op} in:\n{stdout}");
        ok[0]
    });
    assert!(reads > 0.0 && updates > 0.0 && scans > 0.0, "{stdout}");
    assert_eq!(reads + updates + scans, 500.0);
    assert!(!stdout.contains("Return=ERROR"), "errors in:\n{stdout}");
    assert!(
        !stdout.contains("Return=NOT_FOUND"),
        "missing records in:\n{stdout}"
    );

    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json.path()).expect("json written"))
            .expect("valid JSON");
    let results = report["results"].as_array().expect("results");
    assert_eq!(results.len(), 2);
    for (result, (phase, operations)) in results.iter().zip([("load", 200), ("run", 500)]) {
        assert_eq!(result["target"], "etcd");
        assert_eq!(result["phase"], phase);
        assert_eq!(result["operations"], operations);
        assert_eq!(result["first_errors"], serde_json::json!([]), "{result}");
    }
}
