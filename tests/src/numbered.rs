//! Numbered keys and values, for tests that write a batch and read it back:
//! key `i` is `key-00i` (three digits at least, so that they sort in order
//! up to a thousand), its value `value-i`.

use anyhow::{Result, ensure};
use rdkv_client::{Client, Versioned};

pub fn key(i: usize) -> String {
    format!("key-{i:03}")
}

pub fn value(i: usize) -> String {
    format!("value-{i}")
}

/// Writes keys `0..n`, one put each.
pub async fn put_all(client: &Client, n: usize) -> Result<()> {
    for i in 0..n {
        client.put(key(i), value(i)).await?;
    }
    Ok(())
}

/// Reads keys `0..n` one by one, `rounds` times over; fails at the first
/// that is not its value.
pub async fn get_all(client: &Client, n: usize, rounds: usize) -> Result<()> {
    for round in 0..rounds {
        for i in 0..n {
            let got = client.get(key(i)).await?;
            ensure!(
                got.as_ref().is_some_and(|v| v.value == value(i).as_bytes()),
                "round {round}: {} = {got:?}",
                key(i)
            );
        }
    }
    Ok(())
}

/// Fails unless `got`, read for keys `0..`, holds each key's value; `what`
/// says who read them.
pub fn check_all(got: &[Option<Versioned>], what: &str) -> Result<()> {
    for (i, v) in got.iter().enumerate() {
        ensure!(
            v.as_ref().is_some_and(|v| v.value == value(i).as_bytes()),
            "{what}: {} = {v:?}, expected {}",
            key(i),
            value(i)
        );
    }
    Ok(())
}

/// Fails unless node `id` alone (a [`crate::Replica`] read) holds keys
/// `0..n` with their values.
pub async fn check_replica(cluster: &crate::Cluster, id: u64, n: usize) -> Result<()> {
    let values = cluster.replica(id)?.mget((0..n).map(key)).await?;
    check_all(&values, &format!("node {id}"))
}
