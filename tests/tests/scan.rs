//! Ordered range scans against a real 3-node cluster: every consistency
//! level, on leader and followers, scans longer than one reply (by count and
//! by bytes), end keys, deletes, and the server-side counters showing that
//! scans are served by RPC.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use rdkv_client::{Bytes, Consistency};
use rdkv_tests::{Cluster, Intent, check_with_leader};

const KEYS: usize = 2_500;

fn key(i: usize) -> String {
    // Not zero-padded on purpose: bytewise order puts "k10" before "k2".
    format!("k{i}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scans_are_ordered_and_consistent_on_every_node() -> Result<()> {
    let mut cluster = Cluster::start(3)?;
    check_with_leader(&mut cluster, 120, async |cluster, leader| {
        let client = cluster.client(Intent::Any)?;
        let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for chunk in (0..KEYS).collect::<Vec<_>>().chunks(500) {
            let pairs: Vec<(String, Vec<u8>)> = chunk
                .iter()
                .map(|&i| (key(i), format!("v{i}").into_bytes()))
                .collect();
            model.extend(pairs.iter().cloned());
            client.mput(pairs).await?;
        }
        for i in (0..KEYS).step_by(7) {
            client.delete(key(i)).await?;
            model.remove(&key(i));
        }
        // Values large enough that 1,100 of them do not fit one 8 MiB frame.
        let big = vec![b'x'; 8_000];
        for i in 0..1_100 {
            let k = format!("z{i:04}");
            client.put(k.clone(), big.clone()).await?;
            model.insert(k, big.clone());
        }
        let last_write = client.put("zz", "end").await?;
        model.insert("zz".to_owned(), b"end".to_vec());

        let expect = |start: &str, end: Option<&str>, limit: usize| -> Vec<(String, Vec<u8>)> {
            model
                .range(start.to_owned()..)
                .filter(|(k, _)| end.is_none_or(|e| k.as_str() < e))
                .take(limit)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        let as_model =
            |pairs: Vec<(Bytes, rdkv_client::Versioned)>| -> Result<Vec<(String, Vec<u8>)>> {
                pairs
                    .into_iter()
                    .map(|(k, v)| Ok((String::from_utf8(k.to_vec())?, v.value.to_vec())))
                    .collect()
            };

        let before = cluster.status_of(leader).await?.served.scan;
        // More pairs than one reply carries (1,024): the client pages.
        let all = client.scan("", usize::MAX).await?;
        ensure!(
            as_model(all)? == expect("", None, usize::MAX),
            "full scan differs from the model"
        );
        let after = cluster.status_of(leader).await?.served.scan;
        ensure!(
            after - before >= 3,
            "{} keys need at least 3 scan requests; the leader served {}",
            model.len(),
            after - before
        );

        for level in [
            Consistency::Linearizable,
            Consistency::Lease,
            Consistency::Follower { max_lag_entries: 0 },
        ] {
            let got = client
                .scan_range("k1", Some(Bytes::from_static(b"k2")), 50, level)
                .await?;
            ensure!(
                as_model(got)? == expect("k1", Some("k2"), 50),
                "k1..k2 at {level:?}"
            );
        }

        // Every node, followers included, answers follower scans once it has
        // applied the last write.
        for id in 1..=3 {
            let node = cluster.replica(id)?;
            cluster
                .wait_applied(id, last_write, Duration::from_secs(10))
                .await?;
            let before = node.status().await?.served.scan;
            let got = node.scan_range("z", None, 2_000).await?;
            ensure!(
                as_model(got)? == expect("z", None, 2_000),
                "node {id}: large values scanned differently"
            );
            let served = node.status().await?.served.scan - before;
            // ~8.8 MB of values cannot come back in one frame.
            ensure!(
                served >= 2,
                "node {id} served the big scan in {served} request(s)"
            );
        }

        // Limits and empty ranges.
        ensure!(client.scan("k", 0).await?.is_empty());
        ensure!(client.scan("zzz", 10).await?.is_empty());
        ensure!(
            client
                .scan_range(
                    "k5",
                    Some(Bytes::from_static(b"k5")),
                    10,
                    Consistency::Lease
                )
                .await?
                .is_empty(),
            "an empty range returned pairs"
        );
        let one = client.scan("k1", 1).await.context("scan k1 1")?;
        ensure!(as_model(one)? == expect("k1", None, 1));
        Ok(())
    })
    .await
}
