//! `rdkv_proto::shard::key_slot` against a real Redis: a `redis-server
//! --cluster-enabled yes` answers `CLUSTER KEYSLOT` for a few hundred
//! random keys, braces and arbitrary bytes included, and every answer must
//! be rdkv's slot (docs/sharding.md: Redis Cluster clients must route to
//! the shard rdkv would). Needs `redis-server` (`.ci/run` installs it);
//! without it the test is skipped visibly.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, ensure};
use rdkv_proto::shard::key_slot;
use rdkv_tests::{eventually, free_port, skip};

const KEYS: usize = 400;

/// A `redis-server` in cluster mode, killed when dropped.
struct ClusterRedis {
    child: Child,
    port: u16,
}

impl ClusterRedis {
    fn start(dir: &Path) -> Result<ClusterRedis> {
        let port = free_port("127.0.0.1");
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--cluster-enabled",
                "yes",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--cluster-config-file")
            .arg(dir.join("nodes.conf"))
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting redis-server")?;
        Ok(ClusterRedis { child, port })
    }
}

impl Drop for ClusterRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn have_redis_server() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// splitmix64: random keys without a dependency; the seed is printed on a
/// failure, so a failing key set can be made again.
struct Keys(u64);

impl Keys {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Up to 23 bytes, a third of them braces, so that tags (empty,
    /// nested, unclosed) are common.
    fn key(&mut self) -> Vec<u8> {
        let len = self.next_u64() % 24;
        (0..len)
            .map(|_| match self.next_u64() % 6 {
                0 => b'{',
                1 => b'}',
                _ => self.next_u64().to_le_bytes()[0],
            })
            .collect()
    }
}

#[tokio::test]
async fn key_slot_agrees_with_redis_cluster_keyslot() -> Result<()> {
    if !have_redis_server() {
        skip::skip(
            &skip::this_test(),
            "redis-server not installed (apt-get install redis-server; .ci/run does)",
        );
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let redis = ClusterRedis::start(dir.path())?;
    let url = format!("redis://127.0.0.1:{}/", redis.port);
    let mut con = eventually(
        Duration::from_secs(10),
        "redis-server answers",
        async || {
            let client = redis::Client::open(url.as_str())?;
            let mut con = client.get_connection()?;
            redis::cmd("PING").query::<String>(&mut con)?;
            Ok(con)
        },
    )
    .await?;

    let seed = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as u64;
    let mut keys = Keys(seed);
    let mut all: Vec<Vec<u8>> = (0..KEYS).map(|_| keys.key()).collect();
    all.extend([&b"foo"[..], b"{user1000}.following", b"{}", b""].map(<[u8]>::to_vec));
    let mut pipe = redis::pipe();
    for key in &all {
        pipe.cmd("CLUSTER").arg("KEYSLOT").arg(key.as_slice());
    }
    let theirs: Vec<u16> = pipe.query(&mut con)?;
    ensure!(theirs.len() == all.len(), "{} answers", theirs.len());
    for (key, their_slot) in all.iter().zip(theirs) {
        ensure!(
            key_slot(key).get() == their_slot,
            "key {key:?} (seed {seed}): rdkv says slot {}, Redis {their_slot}",
            key_slot(key)
        );
    }
    Ok(())
}
