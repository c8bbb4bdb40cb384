//! Filling a cluster never makes its replicas diverge (issue 14's report,
//! done as a new user did it): three nodes with a tiny region take tiny
//! random keys through every node, over the native protocol and RESP at
//! once, until the quota refuses them (native `NoSpace`, RESP Redis's `OOM`
//! words). Then every replica holds the same live keys and the same state
//! digest at the same applied index, the NOSPACE alarm shows, the leader is
//! killed and every acknowledged write is readable from the new leader, and
//! a delete makes room again.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use rdkv_client::{Client, ClientOptions, Error, Transport};
use rdkv_proto::wire::{Alarm, ErrorCode};
use rdkv_tests::prometheus::http_get;
use rdkv_tests::{
    Cluster, Intent, LEADER_TIMEOUT, check_with_leader, client_options, eventually, lost_writes,
};

/// Refusals a writer sees before it stops: the quota is reached for good
/// (nothing is deleted meanwhile), so the rest would be refused too.
const REFUSALS_TO_STOP: u32 = 20;
/// What Redis answers a write past `maxmemory`, as rdkv must.
const REDIS_OOM: &str = "OOM command not allowed when used memory > 'maxmemory'.";

/// An xorshift64* stream: the keys need only be spread, not secret.
struct Keys(u64);

impl Keys {
    /// 8 hex digits: a tiny random key (its value is the key itself).
    fn next(&mut self) -> String {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        format!("{:08x}", self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32)
    }
}

/// What one writer got: the keys it was told were written, and whether it
/// met the quota's refusal in the protocol's words.
#[derive(Debug, Default)]
struct Written {
    acked: Vec<String>,
    refusals: u32,
}

async fn native_writer(client: Client, mut keys: Keys) -> Result<Written> {
    let mut written = Written::default();
    while written.refusals < REFUSALS_TO_STOP {
        let key = keys.next();
        match client.put(key.clone(), key.clone()).await {
            Ok(_) => written.acked.push(key),
            Err(Error::Server(reply)) if reply.code == ErrorCode::NoSpace => {
                written.refusals += 1;
            }
            // Unknown outcomes are neither acknowledged nor refused.
            Err(_) => {}
        }
    }
    Ok(written)
}

fn resp_writer(addr: SocketAddr, mut keys: Keys) -> Result<Written> {
    let client = redis::Client::open(format!("redis://{addr}/"))?;
    let mut con = client.get_connection_with_timeout(Duration::from_secs(10))?;
    con.set_read_timeout(Some(Duration::from_secs(15)))?;
    let mut written = Written::default();
    while written.refusals < REFUSALS_TO_STOP {
        let key = keys.next();
        let reply: redis::RedisResult<String> =
            redis::cmd("SET").arg(&key).arg(&key).query(&mut con);
        match reply {
            Ok(ok) if ok == "OK" => written.acked.push(key),
            Ok(other) => anyhow::bail!("SET answered {other:?}"),
            Err(e) if e.to_string().contains("OOM") => {
                ensure!(
                    e.to_string().contains("maxmemory"),
                    "not Redis's words: {e}"
                );
                written.refusals += 1;
            }
            Err(_) => {}
        }
    }
    Ok(written)
}

/// Every node's writers, native and RESP, at once; the keys acknowledged.
async fn fill(cluster: &Cluster) -> Result<Vec<String>> {
    let mut native = Vec::new();
    let mut resp = Vec::new();
    for (seed, node) in (1u64..).zip(cluster.nodes.values()) {
        let client = cluster.client_with(
            Intent::Via(&[node.id]),
            ClientOptions {
                transport: Transport::Tcp,
                ..client_options(None)
            },
        )?;
        native.push(tokio::spawn(native_writer(client, Keys(seed * 7919))));
        let addr = node.resp_addr;
        resp.push(tokio::task::spawn_blocking(move || {
            resp_writer(addr, Keys(seed * 104_729))
        }));
    }
    let mut acked = Vec::new();
    for task in native {
        acked.extend(task.await??.acked);
    }
    for task in resp {
        acked.extend(task.await??.acked);
    }
    Ok(acked)
}

/// Every replica at one applied index, with one live key count and one
/// digest there.
async fn replicas_agree(cluster: &Cluster) -> Result<u64> {
    let mut seen = Vec::new();
    for id in cluster.nodes.keys() {
        let status = cluster.replica(*id)?.status().await?;
        seen.push((
            status.applied_index,
            status.state_digest,
            status.region.live_keys,
        ));
    }
    ensure!(
        seen.windows(2).all(|w| w[0] == w[1]),
        "replicas differ (applied index, digest, live keys): {seen:?}"
    );
    Ok(seen[0].2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_cluster_keeps_every_replica_equal_and_every_acknowledged_write() -> Result<()> {
    let mut cluster = Cluster::start_with(3, &["--region-mib", "1"])?;
    check_with_leader(&mut cluster, 300, async |cluster, leader| {
        let acked = fill(cluster).await?;
        ensure!(acked.len() > 1000, "only {} writes went in", acked.len());

        let live_keys = eventually(Duration::from_secs(20), "equal replicas", async || {
            replicas_agree(cluster).await
        })
        .await?;
        ensure!(
            live_keys as usize >= acked.len(),
            "{live_keys} live keys for {} acknowledged writes",
            acked.len()
        );
        let status = cluster.replica(leader)?.status().await?;
        let quota = status.quota.quota_bytes.context("no quota applied")?;
        ensure!(
            status.quota.charged_bytes <= quota,
            "charged {} over the quota {quota}",
            status.quota.charged_bytes
        );
        ensure!(
            status.alarms.contains(&Alarm::NoSpace),
            "no NOSPACE alarm on the leader: {:?}",
            status.alarms
        );
        let http = cluster.node(leader)?.http_addr;
        let (code, body) = tokio::task::spawn_blocking(move || http_get(http, "/health")).await??;
        ensure!(
            code == 503 && body.contains("NOSPACE"),
            "/health {code}: {body}"
        );

        cluster.node_mut(leader)?.kill();
        let survivors: Vec<u64> = cluster
            .nodes
            .keys()
            .copied()
            .filter(|&id| id != leader)
            .collect();
        cluster
            .wait_for_leader_among(&survivors, leader, LEADER_TIMEOUT)
            .await?;
        let client = cluster.client(Intent::Via(&survivors))?;
        let lost = lost_writes(&client, &acked).await?;
        ensure!(
            lost.is_empty(),
            "{} acknowledged writes lost: {:?}",
            lost.len(),
            &lost[..lost.len().min(10)]
        );

        // Full: refused in Redis's words; a delete makes room again.
        let addr = cluster.node(survivors[0])?.resp_addr;
        let first = acked[0].clone();
        tokio::task::spawn_blocking(move || -> Result<()> {
            let client = redis::Client::open(format!("redis://{addr}/"))?;
            let mut con = client.get_connection_with_timeout(Duration::from_secs(10))?;
            let refused: redis::RedisResult<String> =
                redis::cmd("SET").arg("one-more").arg("x").query(&mut con);
            let refusal = refused.err().context("a write past the quota passed")?;
            ensure!(
                refusal
                    .to_string()
                    .contains(REDIS_OOM.trim_start_matches("OOM ")),
                "{refusal}"
            );
            let deleted: i64 = redis::cmd("DEL").arg(&first).query(&mut con)?;
            ensure!(deleted == 1, "DEL answered {deleted}");
            let ok: String = redis::cmd("SET").arg("one-more").arg("x").query(&mut con)?;
            ensure!(ok == "OK", "SET after a delete answered {ok}");
            Ok(())
        })
        .await??;
        Ok(())
    })
    .await
}
