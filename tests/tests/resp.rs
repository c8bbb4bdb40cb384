//! The RESP (Redis protocol) front end against a real 3-node cluster, driven
//! by a real Redis client (the `redis` crate): commands through every node
//! (followers forward to the leader), exact totals from concurrent INCRs,
//! Redis-style errors that keep the connection usable, protocol garbage that
//! closes only its own connection, and the token rule.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use rdkv_tests::raw_resp::raw_exchange;
use rdkv_tests::{Cluster, Intent, check, check_with_leader};

const TEST_LIMIT_SECS: u64 = 120;
const TEST_LIMIT: Duration = Duration::from_secs(TEST_LIMIT_SECS);
const TOKEN: &str = "s3cret";

fn connect(addr: SocketAddr, password: Option<&str>) -> Result<redis::Connection> {
    let url = match password {
        Some(p) => format!("redis://:{p}@{addr}/"),
        None => format!("redis://{addr}/"),
    };
    let client = redis::Client::open(url)?;
    let con = client.get_connection_with_timeout(Duration::from_secs(10))?;
    con.set_read_timeout(Some(Duration::from_secs(15)))?;
    Ok(con)
}

/// A connection to each address, in order.
fn connect_all(addrs: &[SocketAddr]) -> Result<Vec<redis::Connection>> {
    addrs.iter().map(|a| connect(*a, None)).collect()
}

fn resp_addrs(cluster: &Cluster) -> Vec<SocketAddr> {
    cluster.nodes.values().map(|n| n.resp_addr).collect()
}

fn query<T: redis::FromRedisValue>(
    con: &mut redis::Connection,
    args: &[&str],
) -> redis::RedisResult<T> {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(con)
}

fn commands_through_every_node(addrs: &[SocketAddr]) -> Result<()> {
    let mut cons = connect_all(addrs)?;
    // SET through each node, GET through every node.
    for (i, key) in ["k1", "k2", "k3"].iter().enumerate() {
        let value = format!("v{i}");
        let reply: String = query(&mut cons[i], &["SET", key, &value])?;
        ensure!(reply == "OK");
        for con in cons.iter_mut() {
            let got: Option<String> = query(con, &["GET", key])?;
            ensure!(got.as_deref() == Some(value.as_str()), "{key}: {got:?}");
        }
    }
    // MSET through one node, MGET and EXISTS through another, DEL through a third.
    let reply: String = query(&mut cons[1], &["MSET", "a", "1", "b", "2"])?;
    ensure!(reply == "OK");
    let got: Vec<Option<String>> = query(&mut cons[2], &["MGET", "a", "b", "nope"])?;
    ensure!(
        got == vec![Some("1".into()), Some("2".into()), None],
        "{got:?}"
    );
    let n: i64 = query(&mut cons[0], &["EXISTS", "a", "b", "nope", "a"])?;
    ensure!(n == 3, "EXISTS {n}");
    let n: i64 = query(&mut cons[2], &["DEL", "a", "b", "nope"])?;
    ensure!(n == 2, "DEL {n}");
    let got: Option<String> = query(&mut cons[0], &["GET", "a"])?;
    ensure!(got.is_none());
    // INCR through every node: one counter.
    for (i, con) in cons.iter_mut().enumerate() {
        let n: i64 = query(con, &["INCR", "counter"])?;
        ensure!(n == i as i64 + 1, "INCR gave {n}");
    }
    let n: i64 = query(&mut cons[1], &["INCRBY", "counter", "10"])?;
    ensure!(n == 13);
    let n: i64 = query(&mut cons[2], &["DECRBY", "counter", "20"])?;
    ensure!(n == -7);
    // APPEND, STRLEN, SETNX, SET NX/XX/GET, GETSET.
    let n: i64 = query(&mut cons[0], &["APPEND", "s", "ab"])?;
    ensure!(n == 2);
    let n: i64 = query(&mut cons[1], &["APPEND", "s", "cd"])?;
    ensure!(n == 4);
    let n: i64 = query(&mut cons[2], &["STRLEN", "s"])?;
    ensure!(n == 4);
    let n: i64 = query(&mut cons[0], &["SETNX", "s", "x"])?;
    ensure!(n == 0);
    let got: Option<String> = query(&mut cons[1], &["SET", "s", "x", "NX"])?;
    ensure!(got.is_none());
    let got: Option<String> = query(&mut cons[1], &["SET", "fresh", "x", "XX"])?;
    ensure!(got.is_none());
    let got: Option<String> = query(&mut cons[2], &["SET", "s", "new", "GET"])?;
    ensure!(got.as_deref() == Some("abcd"));
    let got: Option<String> = query(&mut cons[0], &["GETSET", "s", "newer"])?;
    ensure!(got.as_deref() == Some("new"));
    // A pipeline: answered in order.
    let mut pipe = redis::pipe();
    for _ in 0..200 {
        pipe.cmd("INCR").arg("piped");
    }
    pipe.cmd("GET").arg("piped");
    // The GET's "200" reads as an integer too.
    let mut replies: Vec<i64> = pipe.query(&mut cons[1])?;
    let last = replies.pop().context("no replies")?;
    ensure!(replies == (1..=200).collect::<Vec<i64>>());
    ensure!(last == 200);
    // DBSIZE is the first node's region, which follows the leader quickly
    // but not instantly: a CI run saw 0 there, the node not yet sent the
    // entries its peers had committed.
    eventually_blocking("DBSIZE of 5 or more through the first node", || {
        let n: i64 = query(&mut cons[0], &["DBSIZE"])?;
        ensure!(n >= 5, "DBSIZE {n}");
        Ok(())
    })?;
    let info: String = query(&mut cons[0], &["INFO"])?;
    ensure!(
        info.contains("# Replication") && info.contains("raft_role:"),
        "{info}"
    );
    let saved: Vec<String> = query(&mut cons[0], &["CONFIG", "GET", "save"])?;
    ensure!(saved == vec!["save".to_owned(), String::new()]);
    Ok(())
}

fn errors_keep_the_connection_usable(addrs: &[SocketAddr]) -> Result<()> {
    let mut con = connect(addrs[0], None)?;
    let error = |result: redis::RedisResult<redis::Value>| match result {
        Err(e) => Ok(e.to_string()),
        Ok(v) => anyhow::bail!("expected an error, got {v:?}"),
    };
    let e = error(query(&mut con, &["NOSUCHCOMMAND", "x"]))?;
    ensure!(e.contains("unknown command"), "{e}");
    let e = error(query(&mut con, &["GET"]))?;
    ensure!(e.contains("wrong number of arguments"), "{e}");
    let _: String = query(&mut con, &["SET", "text", "hello"])?;
    let e = error(query(&mut con, &["INCR", "text"]))?;
    ensure!(e.contains("not an integer"), "{e}");
    let e = error(query(&mut con, &["INCRBY", "n", "x"]))?;
    ensure!(e.contains("not an integer"), "{e}");
    let e = error(query(&mut con, &["SET", "k", "v", "EX", "0"]))?;
    ensure!(e.contains("invalid expire time in 'set' command"), "{e}");
    let e = error(query(&mut con, &["SET", "k", "v", "NX", "XX"]))?;
    ensure!(e.contains("syntax error"), "{e}");
    let big = "x".repeat(1024 * 1024 + 1);
    let e = error(query(&mut con, &["SET", "big", &big]))?;
    ensure!(e.contains("exceeds the maximum value size"), "{e}");
    // Still usable after every error.
    let got: Option<String> = query(&mut con, &["GET", "text"])?;
    ensure!(got.as_deref() == Some("hello"));

    // Protocol garbage closes that connection only, with an error first.
    let out = raw_exchange(addrs[1], b"*1\r\n$x\r\n")?;
    ensure!(out.starts_with(b"-ERR Protocol error"), "{out:?}");
    let mut oversized = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n".to_vec();
    oversized.extend_from_slice(format!("${}\r\n", 1u64 << 40).as_bytes());
    let out = raw_exchange(addrs[1], &oversized)?;
    ensure!(out.starts_with(b"-ERR Protocol error"), "{out:?}");
    let out = raw_exchange(addrs[1], &[0xff; 100_000])?;
    ensure!(out.starts_with(b"-ERR Protocol error"), "{out:?}");
    // Inline commands work too (and QUIT closes).
    let out = raw_exchange(addrs[2], b"PING\r\nECHO hi\r\nQUIT\r\n")?;
    ensure!(out == b"+PONG\r\n$2\r\nhi\r\n+OK\r\n", "{out:?}");
    let got: Option<String> = query(&mut con, &["GET", "text"])?;
    ensure!(got.as_deref() == Some("hello"));
    Ok(())
}

/// A large pipeline written at once while the replies are read: every reply
/// comes back, in order.
fn large_pipelines_are_answered_in_order(addrs: &[SocketAddr]) -> Result<()> {
    const PINGS: usize = 20_000;
    const INCRS: usize = 300;
    let mut stream = TcpStream::connect(addrs[1])?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut writer = stream.try_clone()?;
    let sender = std::thread::spawn(move || -> std::io::Result<()> {
        let mut batch = Vec::new();
        for _ in 0..PINGS {
            batch.extend_from_slice(b"PING\r\n");
        }
        for _ in 0..INCRS {
            batch.extend_from_slice(b"*2\r\n$4\r\nINCR\r\n$9\r\npipelined\r\n");
        }
        batch.extend_from_slice(b"QUIT\r\n");
        writer.write_all(&batch)
    });
    let mut out = Vec::new();
    stream.read_to_end(&mut out)?;
    sender.join().expect("sender thread")?;
    let mut expected = b"+PONG\r\n".repeat(PINGS);
    for i in 1..=INCRS {
        expected.extend_from_slice(format!(":{i}\r\n").as_bytes());
    }
    expected.extend_from_slice(b"+OK\r\n");
    ensure!(
        out == expected,
        "{} bytes of replies, {} expected",
        out.len(),
        expected.len()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_commands_work_through_every_node() -> Result<()> {
    let mut cluster = Cluster::start(3)?;
    check_with_leader(&mut cluster, TEST_LIMIT_SECS, async |cluster, _| {
        let addrs = resp_addrs(cluster);
        let run = addrs.clone();
        tokio::task::spawn_blocking(move || commands_through_every_node(&run)).await??;
        let run = addrs.clone();
        tokio::task::spawn_blocking(move || errors_keep_the_connection_usable(&run)).await??;
        let run = addrs.clone();
        tokio::task::spawn_blocking(move || large_pipelines_are_answered_in_order(&run)).await??;
        let run = addrs.clone();
        tokio::task::spawn_blocking(move || keyspace_through_every_node(&run)).await??;
        // What RESP wrote, the native client reads.
        let client = cluster.client(Intent::Any)?;
        let value = client.get("piped").await?.context("piped is missing")?;
        ensure!(value.value.as_ref() == b"200");
        let value = client.get("counter").await?.context("counter is missing")?;
        ensure!(value.value.as_ref() == b"-7");
        // FLUSHDB through every node (followers forward it) empties every
        // replica.
        let run = addrs.clone();
        flush_through_every_node(&run).await?;
        ensure!(
            client.get("piped").await?.is_none(),
            "piped survived FLUSHDB"
        );
        Ok(())
    })
    .await
}

/// KEYS, SCAN (a whole iteration in small pages), TYPE and UNLINK, each
/// through a different node than the writes.
fn keyspace_through_every_node(addrs: &[SocketAddr]) -> Result<()> {
    let mut cons = connect_all(addrs)?;
    let written: Vec<String> = (0..25).map(|i| format!("ks:{i:02}")).collect();
    let mut mset = redis::cmd("MSET");
    for key in &written {
        mset.arg(key).arg("v");
    }
    let _: () = mset.arg("ks-other").arg("v").query(&mut cons[0])?;
    let keys: Vec<String> = query(&mut cons[1], &["KEYS", "ks:*"])?;
    ensure!(keys == written, "KEYS ks:* {keys:?}");
    let keys: Vec<String> = query(&mut cons[1], &["KEYS", "ks:0[0-4]"])?;
    ensure!(keys == written[..5], "KEYS ks:0[0-4] {keys:?}");
    // SCAN returns every key of the iteration once, whatever the page size.
    let mut cursor = 0u64;
    let mut scanned = Vec::new();
    let mut pages = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg("ks:*")
            .arg("COUNT")
            .arg(7)
            .query(&mut cons[2])?;
        scanned.extend(keys);
        pages += 1;
        ensure!(pages < 1000, "SCAN does not end");
        if next == 0 {
            break;
        }
        cursor = next;
    }
    ensure!(scanned == written, "SCAN {scanned:?}");
    let (_, keys): (u64, Vec<String>) = query(&mut cons[2], &["SCAN", "0", "TYPE", "hash"])?;
    ensure!(keys.is_empty(), "SCAN TYPE hash {keys:?}");
    for cursor in ["123456789", "abc"] {
        let bad: redis::RedisResult<redis::Value> = query(&mut cons[2], &["SCAN", cursor]);
        ensure!(bad.is_err(), "SCAN {cursor} accepted: {bad:?}");
    }
    let kind: String = query(&mut cons[0], &["TYPE", "ks:00"])?;
    let none: String = query(&mut cons[0], &["TYPE", "ks-none"])?;
    ensure!(
        (kind.as_str(), none.as_str()) == ("string", "none"),
        "TYPE {kind} {none}"
    );
    let unlinked: i64 = query(&mut cons[1], &["UNLINK", "ks:00", "ks:01", "ks-none"])?;
    ensure!(unlinked == 2, "UNLINK {unlinked}");
    let keys: Vec<String> = query(&mut cons[2], &["KEYS", "ks:0?"])?;
    ensure!(keys == written[2..10], "KEYS after UNLINK {keys:?}");
    renames_and_copies(&mut cons)
}

/// RENAME, RENAMENX and COPY (decided in the state machine), each through
/// a different node, alone and inside MULTI.
fn renames_and_copies(cons: &mut [redis::Connection]) -> Result<()> {
    let _: () = query(&mut cons[0], &["SET", "r:a", "1"])?;
    let _: () = query(&mut cons[1], &["RENAME", "r:a", "r:b"])?;
    let (a, b): (Option<String>, Option<String>) = (
        query(&mut cons[2], &["GET", "r:a"])?,
        query(&mut cons[2], &["GET", "r:b"])?,
    );
    ensure!(
        a.is_none() && b.as_deref() == Some("1"),
        "RENAME: {a:?} {b:?}"
    );
    let missing = query::<String>(&mut cons[1], &["RENAME", "r:none", "r:x"]);
    ensure!(
        missing
            .as_ref()
            .is_err_and(|e| e.to_string().contains("no such key")),
        "{missing:?}"
    );
    let _: () = query(&mut cons[0], &["SET", "r:c", "2"])?;
    let n: i64 = query(&mut cons[1], &["RENAMENX", "r:b", "r:c"])?;
    ensure!(n == 0, "RENAMENX onto an existing key: {n}");
    let n: i64 = query(&mut cons[1], &["RENAMENX", "r:b", "r:d"])?;
    ensure!(n == 1, "RENAMENX: {n}");
    let copies: Vec<(Vec<&str>, i64)> = vec![
        (vec!["COPY", "r:d", "r:c"], 0),
        (vec!["COPY", "r:d", "r:c", "REPLACE"], 1),
        (vec!["COPY", "r:none", "r:e"], 0),
        (vec!["COPY", "r:d", "r:f", "DB", "0"], 1),
    ];
    for (args, want) in copies {
        let n: i64 = query(&mut cons[2], &args)?;
        ensure!(n == want, "{args:?}: {n}");
    }
    for args in [
        &["COPY", "r:d", "r:d"][..],
        &["COPY", "r:d", "r:g", "DB", "1"],
    ] {
        ensure!(
            query::<i64>(&mut cons[2], args).is_err(),
            "{args:?} accepted"
        );
    }
    let values: Vec<Option<String>> = query(&mut cons[0], &["MGET", "r:c", "r:d", "r:f"])?;
    ensure!(
        values == [Some("1".into()), Some("1".into()), Some("1".into())],
        "after COPY: {values:?}"
    );
    let _: () = query(&mut cons[1], &["MULTI"])?;
    let _: String = query(&mut cons[1], &["RENAME", "r:c", "r:g"])?;
    let _: String = query(&mut cons[1], &["GET", "r:g"])?;
    let replies: (String, String) = redis::cmd("EXEC").query(&mut cons[1])?;
    ensure!(
        replies == ("OK".into(), "1".into()),
        "RENAME in MULTI: {replies:?}"
    );
    Ok(())
}

/// Runs `f` with a fresh connection to `addr` on a blocking thread.
async fn with_connection<T: Send + 'static>(
    addr: SocketAddr,
    f: impl FnOnce(&mut redis::Connection) -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(move || f(&mut connect(addr, None)?)).await?
}

async fn flush_through_every_node(addrs: &[SocketAddr]) -> Result<()> {
    for (i, addr) in addrs.iter().enumerate() {
        with_connection(*addr, move |con| {
            let _: () = query(con, &["SET", &format!("flush-{i}"), "x"])?;
            let reply: String = query(con, &["FLUSHDB"])?;
            ensure!(reply == "OK", "FLUSHDB through node {i}: {reply}");
            Ok(())
        })
        .await?;
        // DBSIZE is the first node's region: it follows the leader quickly,
        // but not instantly.
        let first = addrs[0];
        rdkv_tests::eventually(
            Duration::from_secs(10),
            "DBSIZE 0 after FLUSHDB",
            async || {
                let size: i64 = with_connection(first, |con| Ok(query(con, &["DBSIZE"])?)).await?;
                ensure!(size == 0, "{size} keys left after FLUSHDB through node {i}");
                Ok(())
            },
        )
        .await?;
    }
    let bad = with_connection(addrs[0], |con| {
        Ok(query::<String>(con, &["FLUSHDB", "NOW"]).is_err())
    })
    .await?;
    ensure!(bad, "FLUSHDB NOW accepted");
    Ok(())
}

/// A whole SCAN iteration through `con`, in pages of `count` when given
/// (each page checked against it): every key it returned, in order,
/// duplicates kept.
fn scan_walk(
    con: &mut redis::Connection,
    pattern: &str,
    count: Option<usize>,
) -> Result<Vec<String>> {
    let mut cursor = 0u64;
    let mut keys = Vec::new();
    loop {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor).arg("MATCH").arg(pattern);
        if let Some(count) = count {
            scan.arg("COUNT").arg(count);
        }
        let (next, page): (u64, Vec<String>) = scan.query(con)?;
        if let Some(count) = count {
            ensure!(
                page.len() <= count,
                "a page of {} keys for COUNT {count}",
                page.len()
            );
        }
        keys.extend(page);
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// `keys` (of every shard) written through every node, then KEYS and
/// whole SCAN walks through every node return each of them exactly once,
/// nothing else.
fn keys_and_scan_span_every_shard(addrs: &[SocketAddr], keys: &[String]) -> Result<()> {
    let mut cons = connect_all(addrs)?;
    for (i, key) in keys.iter().enumerate() {
        let at = i % cons.len();
        let reply: String = query(&mut cons[at], &["SET", key, "x"])?;
        ensure!(reply == "OK", "SET {key}: {reply}");
    }
    let mut expected = keys.to_vec();
    expected.sort();
    let matching: Vec<String> = expected
        .iter()
        .filter(|k| k.starts_with("span-1"))
        .cloned()
        .collect();
    for (node, con) in cons.iter_mut().enumerate() {
        let mut all: Vec<String> = query(con, &["KEYS", "*"])?;
        all.sort();
        ensure!(all == expected, "KEYS * through node {node}: {all:?}");
        // Key order across shards: already sorted, each key once.
        let walked = scan_walk(con, "*", Some(7))?;
        ensure!(
            walked == expected,
            "SCAN COUNT 7 through node {node}: {walked:?}"
        );
        let walked = scan_walk(con, "span-1*", Some(7))?;
        ensure!(
            walked == matching,
            "SCAN MATCH through node {node}: {walked:?}"
        );
    }
    Ok(())
}

/// DBSIZE through every node is `expected`: the sum of the shards'
/// leaders' counts, exact once the writes were acknowledged.
async fn dbsize_everywhere(addrs: &[SocketAddr], expected: i64) -> Result<()> {
    for (node, addr) in addrs.iter().enumerate() {
        let size: i64 = with_connection(*addr, |con| Ok(query(con, &["DBSIZE"])?)).await?;
        ensure!(
            size == expected,
            "DBSIZE {size} through node {node}, not {expected}"
        );
    }
    Ok(())
}

/// The `keys=` counts of INFO's `# Shards` lines (one per hosted shard
/// replica) and of its `db0` line.
fn info_key_counts(info: &str) -> Result<(Vec<u64>, u64)> {
    let keys_of = |line: &str| -> Result<u64> {
        let field = line
            .split([',', ':'])
            .find_map(|f| f.strip_prefix("keys="))
            .with_context(|| format!("no keys= in {line:?}"))?;
        Ok(field.parse()?)
    };
    let shards = info
        .lines()
        .filter(|l| l.starts_with("shard"))
        .map(keys_of)
        .collect::<Result<Vec<_>>>()?;
    let db0 = info
        .lines()
        .find(|l| l.starts_with("db0:"))
        .context("no db0 line")?;
    Ok((shards, keys_of(db0)?))
}

/// INFO on every node: a `# Shards` line per hosted replica (2 of 3
/// shards each), the node's keyspace their sum, and, once every replica
/// applied, `replicas` copies of every key over the cluster.
async fn info_shards_everywhere(addrs: &[SocketAddr], keys: u64, replicas: u64) -> Result<()> {
    rdkv_tests::eventually(
        Duration::from_secs(20),
        "every replica applied",
        async || {
            let mut total = 0;
            for addr in addrs {
                let info: String = with_connection(*addr, |con| Ok(query(con, &["INFO"])?)).await?;
                ensure!(info.contains("# Shards\r\n"), "{info}");
                let (shards, db0) = info_key_counts(&info)?;
                ensure!(shards.len() == 2, "{addr}: {info}");
                ensure!(shards.iter().sum::<u64>() == db0, "{addr}: {info}");
                total += db0;
            }
            ensure!(
                total == keys * replicas,
                "{total} keys over the nodes' replicas"
            );
            Ok(())
        },
    )
    .await
}

/// On a multi-shard node KEYS, SCAN, DBSIZE and FLUSHDB span every shard:
/// 3 nodes, 3 shards of 2 replicas, so each node also answers for a shard
/// it does not host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyspace_commands_span_every_shard() -> Result<()> {
    use rdkv_tests::shard_view::{agreed_leaders, agreed_map, keys_per_shard, node_ids};

    let flags = ["--shards", "3", "--replicas", "2", "--region-mib", "16"];
    let mut cluster = Cluster::start_with(3, &flags)?;
    check(&mut cluster, TEST_LIMIT, async |cluster| {
        let ids = node_ids(cluster);
        rdkv_tests::eventually(
            rdkv_tests::LEADER_TIMEOUT,
            "a leader in every shard",
            async || agreed_leaders(cluster, &ids).await.map(drop),
        )
        .await?;
        // RESP forwards over every node the map names with its address:
        // wait until each node has published its own.
        let map = rdkv_tests::eventually(
            rdkv_tests::LEADER_TIMEOUT,
            "every node's addresses in the map",
            async || agreed_map(cluster, &ids).await,
        )
        .await?;
        let keys: Vec<String> = keys_per_shard(&map, 20, |i| format!("span-{i}"))
            .into_iter()
            .map(|(_, key)| key)
            .collect();
        let count = i64::try_from(keys.len())?;
        let addrs = resp_addrs(cluster);
        let run = addrs.clone();
        tokio::task::spawn_blocking(move || keys_and_scan_span_every_shard(&run, &keys)).await??;
        dbsize_everywhere(&addrs, count).await?;
        info_shards_everywhere(&addrs, u64::try_from(count)?, 2).await?;
        // FLUSHDB through one node clears every shard.
        let keys_left = with_connection(addrs[1], |con| {
            let reply: String = query(con, &["FLUSHDB"])?;
            ensure!(reply == "OK", "FLUSHDB: {reply}");
            Ok(query::<Vec<String>>(con, &["KEYS", "*"])?)
        })
        .await?;
        ensure!(keys_left.is_empty(), "KEYS after FLUSHDB: {keys_left:?}");
        dbsize_everywhere(&addrs, 0).await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_incr_through_every_node_is_exact() -> Result<()> {
    const CLIENTS_PER_NODE: usize = 2;
    const INCRS: i64 = 40;
    let mut cluster = Cluster::start(3)?;
    check_with_leader(&mut cluster, TEST_LIMIT_SECS, async |cluster, _| {
        let addrs = resp_addrs(cluster);
        let mut workers = Vec::new();
        for addr in &addrs {
            for _ in 0..CLIENTS_PER_NODE {
                let addr = *addr;
                workers.push(tokio::task::spawn_blocking(move || -> Result<()> {
                    let mut con = connect(addr, None)?;
                    for _ in 0..INCRS {
                        let _: i64 = query(&mut con, &["INCR", "total"])?;
                    }
                    Ok(())
                }));
            }
        }
        for worker in workers {
            worker.await??;
        }
        let expected = INCRS * (addrs.len() * CLIENTS_PER_NODE) as i64;
        let addr = addrs[2];
        let got: i64 = tokio::task::spawn_blocking(move || -> Result<i64> {
            let mut con = connect(addr, None)?;
            Ok(query(&mut con, &["GET", "total"])?)
        })
        .await??;
        ensure!(got == expected, "INCR total {got}, expected {expected}");
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_required_on_the_resp_port() -> Result<()> {
    let mut cluster = Cluster::start_with(1, &["--token", TOKEN])?;
    check(&mut cluster, TEST_LIMIT, async |cluster| {
        cluster.serving_client(TOKEN).await?;
        let addr = resp_addrs(cluster)[0];
        tokio::task::spawn_blocking(move || -> Result<()> {
            let out = raw_exchange(
                addr,
                b"GET k\r\nPING\r\nAUTH wrong\r\nAUTH s3cret\r\nGET k\r\nQUIT\r\n",
            )?;
            let text = String::from_utf8_lossy(&out);
            ensure!(
                text == "-NOAUTH Authentication required.\r\n+PONG\r\n-WRONGPASS invalid username-password pair or user is disabled.\r\n+OK\r\n$-1\r\n+OK\r\n",
                "{text:?}"
            );
            let out = raw_exchange(addr, b"HELLO 2 AUTH default s3cret\r\nGET k\r\nQUIT\r\n")?;
            ensure!(out.starts_with(b"*14\r\n") && out.ends_with(b"$-1\r\n+OK\r\n"), "{out:?}");
            // Before AUTH, large commands are refused unread.
            let out = raw_exchange(addr, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$100000\r\n")?;
            ensure!(out.starts_with(b"-ERR Protocol error"), "{out:?}");
            // A client library with the password in its URL.
            let mut con = connect(addr, Some(TOKEN))?;
            let _: String = query(&mut con, &["SET", "k", "v"])?;
            let got: String = query(&mut con, &["GET", "k"])?;
            ensure!(got == "v");
            Ok(())
        })
        .await??;
        Ok(())
    })
    .await
}

/// Reads replies until `expected_len` bytes have arrived (the connection
/// stays open).
fn raw_request(stream: &mut TcpStream, bytes: &[u8], expected_len: usize) -> Result<Vec<u8>> {
    stream.write_all(bytes)?;
    let mut out = vec![0u8; expected_len];
    stream
        .read_exact(&mut out)
        .context("fewer reply bytes than expected")?;
    Ok(out)
}

/// HELLO 3 switches the connection to RESP3 after AUTH and SETNAME, and
/// RESET switches it back (and logs it out); byte for byte.
fn hello_switches_the_protocol(addr: SocketAddr) -> Result<()> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    // Refused HELLOs change nothing: an unknown version, a wrong password.
    let refused = b"-NOPROTO unsupported protocol version\r\n\
        -WRONGPASS invalid username-password pair or user is disabled.\r\n\
        -NOAUTH Authentication required.\r\n";
    let out = raw_request(
        &mut stream,
        b"HELLO 4\r\nHELLO 3 AUTH default wrong\r\nGET k\r\n",
        refused.len(),
    )?;
    ensure!(out == refused, "{}", String::from_utf8_lossy(&out));
    let hello = b"HELLO 3 AUTH default s3cret SETNAME app\r\n";
    let head = b"%7\r\n$6\r\nserver\r\n$4\r\nrdkv\r\n";
    let out = raw_request(&mut stream, hello, head.len())?;
    ensure!(out == head, "{}", String::from_utf8_lossy(&out));
    // The rest of the map, then RESP3 nulls; RESET answers in RESP3 and
    // the next command in RESP2.
    let mut rest = Vec::new();
    stream.write_all(
        b"GET missing\r\nMGET missing\r\nCLIENT GETNAME\r\nRESET\r\nGET k\r\nHELLO\r\nQUIT\r\n",
    )?;
    stream.read_to_end(&mut rest)?;
    let text = String::from_utf8_lossy(&rest);
    let tail = "_\r\n*1\r\n_\r\n$3\r\napp\r\n+RESET\r\n-NOAUTH Authentication required.\r\n";
    ensure!(
        text.contains("$5\r\nproto\r\n:3\r\n") && text.contains("$7\r\nmodules\r\n*0\r\n"),
        "{text}"
    );
    ensure!(
        text.contains(tail) && text.ends_with("+OK\r\n"),
        "RESP3 replies after HELLO: {text}"
    );
    Ok(())
}

/// The `redis` crate over RESP3 (its `protocol=resp3`): nulls, maps and
/// verbatim strings decode, and the connection's name and protocol show
/// in CLIENT LIST.
fn resp3_client_through_every_node(addrs: &[SocketAddr]) -> Result<()> {
    for (i, addr) in addrs.iter().enumerate() {
        let url = format!("redis://:{TOKEN}@{addr}/?protocol=resp3");
        let client = redis::Client::open(url)?;
        let mut con = client.get_connection_with_timeout(Duration::from_secs(10))?;
        con.set_read_timeout(Some(Duration::from_secs(15)))?;
        let key = format!("resp3-{i}");
        let _: () = query(&mut con, &["SET", &key, "v"])?;
        let got: Vec<Option<String>> = query(&mut con, &["MGET", &key, "resp3-none"])?;
        ensure!(got == vec![Some("v".into()), None], "{got:?}");
        let name = format!("worker-{i}");
        let _: () = query(&mut con, &["CLIENT", "SETNAME", &name])?;
        let got: Option<String> = query(&mut con, &["CLIENT", "GETNAME"])?;
        ensure!(got.as_deref() == Some(name.as_str()), "{got:?}");
        let list = redis::cmd("CLIENT")
            .arg("LIST")
            .query::<redis::Value>(&mut con)?;
        let redis::Value::VerbatimString { text, .. } = &list else {
            anyhow::bail!("CLIENT LIST is not a verbatim string in RESP3: {list:?}");
        };
        let line = text
            .lines()
            .find(|l| l.contains(&format!(" name={name} ")))
            .with_context(|| format!("{name} not in CLIENT LIST: {text}"))?;
        ensure!(line.contains(" resp=3 "), "{line}");
        let config: std::collections::HashMap<String, String> =
            query(&mut con, &["CONFIG", "GET", "appendonly"])?;
        ensure!(config.get("appendonly").map(String::as_str) == Some("no"));
        let info = redis::cmd("INFO")
            .arg("server")
            .query::<redis::Value>(&mut con)?;
        ensure!(
            matches!(info, redis::Value::VerbatimString { .. }),
            "{info:?}"
        );
        let (a, b): (i64, Option<String>) = redis::pipe()
            .cmd("INCR")
            .arg(format!("resp3-counter-{i}"))
            .cmd("GET")
            .arg("resp3-none")
            .query(&mut con)?;
        ensure!(a == 1 && b.is_none(), "{a} {b:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp3_clients_negotiate_with_hello_through_every_node() -> Result<()> {
    let mut cluster = Cluster::start_with(3, &["--token", TOKEN])?;
    check(&mut cluster, TEST_LIMIT, async |cluster| {
        cluster.serving_client(TOKEN).await?;
        let addrs = resp_addrs(cluster);
        let first = addrs[0];
        tokio::task::spawn_blocking(move || hello_switches_the_protocol(first)).await??;
        tokio::task::spawn_blocking(move || resp3_client_through_every_node(&addrs)).await??;
        Ok(())
    })
    .await
}

fn exec_cmd(con: &mut redis::Connection) -> redis::RedisResult<redis::Value> {
    redis::cmd("EXEC").query(con)
}

/// MULTI/EXEC answers every queued command in order; errors while
/// queueing discard the transaction; WATCH aborts it when a watched key
/// changed; DISCARD drops it.
fn transactions_through_every_node(addrs: &[SocketAddr]) -> Result<()> {
    use redis::Value;
    let mut cons = connect_all(addrs)?;
    let con = &mut cons[1];
    let _: () = query(con, &["MULTI"])?;
    for args in [
        &["SET", "t:a", "1"][..],
        &["INCR", "t:n"],
        &["GET", "t:a"],
        &["MGET", "t:a", "t:none"],
        &["DEL", "t:a", "t:none"],
        &["EXISTS", "t:a", "t:n"],
        &["PING"],
    ] {
        let queued: String = query(con, args)?;
        ensure!(queued == "QUEUED", "{args:?}: {queued}");
    }
    let replies = exec_cmd(con)?;
    let Value::Array(replies) = replies else {
        anyhow::bail!("EXEC: {replies:?}");
    };
    let shown: Vec<String> = replies.iter().map(|r| format!("{r:?}")).collect();
    ensure!(replies.len() == 7, "{shown:?}");
    ensure!(matches!(&replies[0], Value::Okay), "{shown:?}");
    ensure!(matches!(&replies[1], Value::Int(1)), "{shown:?}");
    ensure!(
        matches!(&replies[2], Value::BulkString(v) if v == b"1"),
        "{shown:?}"
    );
    ensure!(
        matches!(&replies[3], Value::Array(v) if v.len() == 2 && v[1] == Value::Nil),
        "{shown:?}"
    );
    ensure!(matches!(&replies[4], Value::Int(1)), "{shown:?}");
    ensure!(matches!(&replies[5], Value::Int(1)), "{shown:?}");
    // An error only EXEC finds is that command's reply; the others apply
    // (raw bytes: the redis crate turns an EXEC holding an error into one).
    let out = raw_exchange(
        addrs[0],
        b"MULTI\r\nINCRBY t:x notanumber\r\nSET t:y 1\r\nEXEC\r\nGET t:y\r\nQUIT\r\n",
    )?;
    let text = String::from_utf8_lossy(&out);
    ensure!(
        text == "+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n-ERR value is not an integer or out of range\r\n+OK\r\n$1\r\n1\r\n+OK\r\n",
        "{text}"
    );
    // An error while queueing discards the whole transaction.
    let _: () = query(con, &["MULTI"])?;
    let _: String = query(con, &["SET", "t:b", "1"])?;
    ensure!(
        query::<String>(con, &["SET", "t:b"]).is_err(),
        "arity error queued"
    );
    ensure!(query::<String>(con, &["KEYS", "*"]).is_err(), "KEYS queued");
    let aborted = exec_cmd(con);
    ensure!(
        aborted
            .as_ref()
            .is_err_and(|e| e.to_string().to_uppercase().contains("EXECABORT")),
        "{aborted:?}"
    );
    let gone: Option<String> = query(con, &["GET", "t:b"])?;
    ensure!(gone.is_none(), "a discarded transaction wrote t:b");
    // WATCH: a change through another node aborts, none lets it apply.
    let _: () = query(&mut cons[0], &["SET", "t:w", "1"])?;
    let _: () = query(&mut cons[1], &["WATCH", "t:w", "t:unset"])?;
    let _: () = query(&mut cons[2], &["SET", "t:w", "2"])?;
    let _: () = query(&mut cons[1], &["MULTI"])?;
    let _: String = query(&mut cons[1], &["SET", "t:w", "3"])?;
    let aborted = exec_cmd(&mut cons[1])?;
    ensure!(
        aborted == Value::Nil,
        "EXEC after a watched change: {aborted:?}"
    );
    let w: String = query(&mut cons[0], &["GET", "t:w"])?;
    ensure!(w == "2", "t:w {w}");
    let _: () = query(&mut cons[1], &["WATCH", "t:w"])?;
    let _: () = query(&mut cons[1], &["MULTI"])?;
    let _: String = query(&mut cons[1], &["INCR", "t:w"])?;
    let done = exec_cmd(&mut cons[1])?;
    ensure!(done == Value::Array(vec![Value::Int(3)]), "{done:?}");
    // DISCARD, and the errors Redis gives.
    let con = &mut cons[2];
    let _: () = query(con, &["MULTI"])?;
    let _: String = query(con, &["SET", "t:d", "1"])?;
    ensure!(
        query::<String>(con, &["WATCH", "t:d"]).is_err(),
        "WATCH inside MULTI"
    );
    ensure!(query::<String>(con, &["MULTI"]).is_err(), "nested MULTI");
    let _: () = query(con, &["DISCARD"])?;
    let d: Option<String> = query(con, &["GET", "t:d"])?;
    ensure!(d.is_none(), "DISCARD applied t:d");
    ensure!(exec_cmd(con).is_err(), "EXEC without MULTI");
    ensure!(
        query::<String>(con, &["DISCARD"]).is_err(),
        "DISCARD without MULTI"
    );
    Ok(())
}

/// Optimistic increments (WATCH, GET, MULTI, SET, EXEC, retried when
/// aborted) from clients on every node: the counter ends at exactly the
/// number of transactions that committed.
fn watched_increments_are_exact(addrs: &[SocketAddr]) -> Result<(u64, u64)> {
    const CLIENTS_PER_NODE: usize = 2;
    const INCREMENTS: u64 = 25;
    let workers: Vec<_> = addrs
        .iter()
        .flat_map(|addr| std::iter::repeat_n(*addr, CLIENTS_PER_NODE))
        .map(|addr| {
            std::thread::spawn(move || -> Result<u64> {
                let mut con = connect(addr, None)?;
                let mut aborted = 0;
                let mut committed = 0;
                while committed < INCREMENTS {
                    let _: () = query(&mut con, &["WATCH", "t:counter"])?;
                    let now: Option<u64> = query(&mut con, &["GET", "t:counter"])?;
                    let _: () = query(&mut con, &["MULTI"])?;
                    let next = (now.unwrap_or(0) + 1).to_string();
                    let _: String = query(&mut con, &["SET", "t:counter", &next])?;
                    match exec_cmd(&mut con)? {
                        redis::Value::Nil => aborted += 1,
                        redis::Value::Array(replies) if replies == [redis::Value::Okay] => {
                            committed += 1;
                        }
                        other => anyhow::bail!("EXEC: {other:?}"),
                    }
                }
                Ok(aborted)
            })
        })
        .collect();
    let mut aborted = 0;
    for worker in workers {
        aborted += worker
            .join()
            .map_err(|_| anyhow::anyhow!("a client panicked"))??;
    }
    let expected = INCREMENTS * (addrs.len() * CLIENTS_PER_NODE) as u64;
    let mut con = connect(addrs[0], None)?;
    let total: u64 = query(&mut con, &["GET", "t:counter"])?;
    ensure!(total == expected, "counter {total}, {expected} committed");
    Ok((total, aborted))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_apply_whole_and_watch_aborts_them() -> Result<()> {
    let mut cluster = Cluster::start(3)?;
    check_with_leader(&mut cluster, TEST_LIMIT_SECS, async |cluster, _| {
        let addrs = resp_addrs(cluster);
        let run = addrs.clone();
        tokio::task::spawn_blocking(move || transactions_through_every_node(&run)).await??;
        let (total, aborted) =
            tokio::task::spawn_blocking(move || watched_increments_are_exact(&addrs)).await??;
        eprintln!("WATCH increments: {total} committed, {aborted} aborted and retried");
        Ok(())
    })
    .await
}

/// How long a test waits for a key to expire: its TTL is far shorter, and
/// the active expire cycle runs every 100 ms; the margin is for a loaded
/// machine.
const EXPIRY_WAIT: Duration = Duration::from_secs(20);

/// Sends inline `commands` (then QUIT) to `addr` and checks that the
/// replies are exactly `replies` (raw RESP2 lines, so error texts are
/// compared whole).
fn replies_are(addr: SocketAddr, exchanges: &[(&str, &str)]) -> Result<()> {
    let mut input = String::new();
    let mut want = String::new();
    for (command, reply) in exchanges {
        input.push_str(&format!("{command}\r\n"));
        want.push_str(&format!("{reply}\r\n"));
    }
    input.push_str("QUIT\r\n");
    want.push_str("+OK\r\n");
    let out = raw_exchange(addr, input.as_bytes())?;
    let got = String::from_utf8_lossy(&out);
    let (got_lines, want_lines): (Vec<&str>, Vec<&str>) =
        (got.split("\r\n").collect(), want.split("\r\n").collect());
    let first_difference = got_lines.iter().zip(&want_lines).position(|(g, w)| g != w);
    ensure!(
        got == want,
        "replies differ from line {first_difference:?}:\n{got}\nwanted:\n{want}"
    );
    Ok(())
}

const INVALID_SET: &str = "-ERR invalid expire time in 'set' command";
const NOT_INTEGER: &str = "-ERR value is not an integer or out of range";
const SYNTAX: &str = "-ERR syntax error";
const NX_AND_OTHERS: &str = "-ERR NX and XX, GT or LT options at the same time are not compatible";
/// 2100-01-01T00:00:00Z in unix seconds: a deadline no test outlives.
const Y2100: &str = "4102444800";

/// The argument errors of the expiry commands, word for word as Redis 7.
fn expiry_errors(addr: SocketAddr) -> Result<()> {
    replies_are(
        addr,
        &[
            ("SET x:k v", "+OK"),
            ("SET x:k v EX 0", INVALID_SET),
            ("SET x:k v PX -1", INVALID_SET),
            ("SET x:k v EXAT 0", INVALID_SET),
            ("SET x:k v EX 9223372036854776", INVALID_SET),
            ("SET x:k v PX 9223372036854775807", INVALID_SET),
            ("SET x:k v EX ten", NOT_INTEGER),
            ("SET x:k v NX XX", SYNTAX),
            ("SET x:k v EX 1 PX 1", SYNTAX),
            ("SET x:k v KEEPTTL EX 1", SYNTAX),
            ("SET x:k v EX", SYNTAX),
            (
                "SETEX x:k 0 v",
                "-ERR invalid expire time in 'setex' command",
            ),
            (
                "PSETEX x:k -1 v",
                "-ERR invalid expire time in 'psetex' command",
            ),
            ("SETEX x:k ten v", NOT_INTEGER),
            (
                "SETEX x:k 10",
                "-ERR wrong number of arguments for 'setex' command",
            ),
            ("EXPIRE x:k 10 NX XX", NX_AND_OTHERS),
            ("EXPIRE x:k 10 GT NX", NX_AND_OTHERS),
            (
                "EXPIRE x:k 10 GT LT",
                "-ERR GT and LT options at the same time are not compatible",
            ),
            ("EXPIRE x:k 10 FOO", "-ERR Unsupported option FOO"),
            ("EXPIRE x:k ten", NOT_INTEGER),
            (
                "EXPIRE x:k 9223372036854776",
                "-ERR invalid expire time in 'expire' command",
            ),
            (
                "PEXPIRE x:k 9223372036854775807",
                "-ERR invalid expire time in 'pexpire' command",
            ),
            (
                "EXPIREAT x:k -9223372036854776",
                "-ERR invalid expire time in 'expireat' command",
            ),
            (
                "GETEX x:k EX 0",
                "-ERR invalid expire time in 'getex' command",
            ),
            // Redis looks the key up first: an absent key is a null.
            ("GETEX x:none EX 0", "$-1"),
            ("GETEX x:k FOO", SYNTAX),
            ("GETEX x:k EX 1 PERSIST", SYNTAX),
            // Nothing refused changed the key.
            ("GET x:k", "$1\r\nv"),
            ("TTL x:k", ":-1"),
            // Inside MULTI an argument error is that command's reply.
            ("MULTI", "+OK"),
            ("SET x:k v EX 0", "+QUEUED"),
            ("GETEX x:none PX 0", "+QUEUED"),
            ("GETEX x:k PX 0", "+QUEUED"),
            ("EXPIRE x:k 1 NX LT", "+QUEUED"),
            ("TTL x:k", "+QUEUED"),
            (
                "EXEC",
                "*5\r\n-ERR invalid expire time in 'set' command\r\n$-1\r\n\
                 -ERR invalid expire time in 'getex' command\r\n\
                 -ERR NX and XX, GT or LT options at the same time are not compatible\r\n:-1",
            ),
        ],
    )
}

/// The expiry commands' replies that do not depend on time passing, as
/// Redis 7 gives them.
fn expiry_replies(addr: SocketAddr) -> Result<()> {
    let at = |command: &str, time: &str, options: &str| {
        format!("{command} x:k {time} {options}").trim().to_owned()
    };
    let exchanges: Vec<(String, &str)> = vec![
        ("SET x:k v".into(), "+OK"),
        ("TTL x:none".into(), ":-2"),
        ("PTTL x:none".into(), ":-2"),
        ("PEXPIRETIME x:none".into(), ":-2"),
        ("EXPIRETIME x:k".into(), ":-1"),
        ("PTTL x:k".into(), ":-1"),
        ("PERSIST x:k".into(), ":0"),
        ("PERSIST x:none".into(), ":0"),
        ("EXPIRE x:none 10".into(), ":0"),
        ("EXPIRE x:k 100 XX".into(), ":0"),
        ("EXPIRE x:k 100 GT".into(), ":0"),
        ("EXPIRE x:k 100 XX LT".into(), ":0"),
        (at("EXPIREAT", Y2100, "NX"), ":1"),
        ("EXPIRETIME x:k".into(), ":4102444800"),
        ("PEXPIRETIME x:k".into(), ":4102444800000"),
        // The same deadline again is a change in Redis too.
        (at("EXPIREAT", Y2100, ""), ":1"),
        (at("EXPIREAT", Y2100, "GT"), ":0"),
        (at("EXPIREAT", "4102444801", "GT"), ":1"),
        (at("EXPIREAT", "4102444802", "LT"), ":0"),
        (at("PEXPIREAT", "4102444800500", "XX LT"), ":1"),
        ("PEXPIRETIME x:k".into(), ":4102444800500"),
        // Seconds are rounded as Redis rounds them.
        ("EXPIRETIME x:k".into(), ":4102444801"),
        ("EXPIRE x:k 100 NX".into(), ":0"),
        ("PERSIST x:k".into(), ":1"),
        ("TTL x:k".into(), ":-1"),
        // LT treats "no deadline" as an infinite one.
        ("EXPIRE x:k 100 LT".into(), ":1"),
        ("PERSIST x:k".into(), ":1"),
        // A time not in the future deletes the key, answering 1.
        ("EXPIRE x:k 0".into(), ":1"),
        ("EXISTS x:k".into(), ":0"),
        ("SET x:k v".into(), "+OK"),
        ("PEXPIRE x:k -1".into(), ":1"),
        ("GET x:k".into(), "$-1"),
        ("SET x:k v".into(), "+OK"),
        ("EXPIREAT x:k 1".into(), ":1"),
        ("TYPE x:k".into(), "+none"),
        ("SET x:k v EXAT 1".into(), "+OK"),
        ("GET x:k".into(), "$-1"),
        ("SET x:k v".into(), "+OK"),
        ("SET x:k w GET PXAT 1".into(), "$1\r\nv"),
        ("EXISTS x:k".into(), ":0"),
        ("SET x:k v".into(), "+OK"),
        ("GETEX x:k PXAT 1".into(), "$1\r\nv"),
        ("EXISTS x:k".into(), ":0"),
        ("SET x:k v".into(), "+OK"),
        ("GETDEL x:k".into(), "$1\r\nv"),
        ("GETDEL x:k".into(), "$-1"),
        ("GET x:k".into(), "$-1"),
    ];
    let exchanges: Vec<(&str, &str)> = exchanges
        .iter()
        .map(|(command, reply)| (command.as_str(), *reply))
        .collect();
    replies_are(addr, &exchanges)
}

/// Expiry commands inside MULTI: every write and TTL of the transaction
/// counts from the time the leader stamped on its one log entry, so the
/// replies are exact.
fn expiry_inside_multi(addr: SocketAddr) -> Result<()> {
    replies_are(
        addr,
        &[
            ("MULTI", "+OK"),
            ("SET x:m v EX 100", "+QUEUED"),
            ("TTL x:m", "+QUEUED"),
            ("PTTL x:m", "+QUEUED"),
            ("GETEX x:m PERSIST", "+QUEUED"),
            ("TTL x:m", "+QUEUED"),
            ("PSETEX x:m2 10000 w", "+QUEUED"),
            ("PTTL x:m2", "+QUEUED"),
            ("EXPIRE x:m 0", "+QUEUED"),
            ("EXISTS x:m", "+QUEUED"),
            ("GETDEL x:m2", "+QUEUED"),
            (
                "EXEC",
                "*10\r\n+OK\r\n:100\r\n:100000\r\n$1\r\nv\r\n:-1\r\n+OK\r\n:10000\r\n:1\r\n:0\r\n$1\r\nw",
            ),
        ],
    )
}

fn integer(con: &mut redis::Connection, args: &[&str]) -> Result<i64> {
    Ok(query(con, args)?)
}

fn value(con: &mut redis::Connection, args: &[&str]) -> Result<Option<String>> {
    Ok(query(con, args)?)
}

/// Runs `attempt` until it succeeds, from a blocking thread of the test's
/// runtime (the redis connections are blocking).
fn eventually_blocking(what: &str, mut attempt: impl FnMut() -> Result<()>) -> Result<()> {
    tokio::runtime::Handle::current().block_on(rdkv_tests::eventually(
        EXPIRY_WAIT,
        what,
        async || attempt(),
    ))
}

/// A key set with `PX 300` is there, then gone from every read and, once
/// the active expire cycle removed it, from every replica's region.
fn a_short_ttl_expires_everywhere(cons: &mut [redis::Connection]) -> Result<()> {
    use redis::Value;
    // Inside one transaction the read sees the key whatever the machine's
    // load: both count from the entry's stamp.
    let _: () = query(&mut cons[0], &["MULTI"])?;
    let _: String = query(&mut cons[0], &["SET", "x:short", "v", "PX", "300"])?;
    let _: String = query(&mut cons[0], &["GET", "x:short"])?;
    let _: String = query(&mut cons[0], &["PTTL", "x:short"])?;
    let replies = exec_cmd(&mut cons[0])?;
    let there = Value::Array(vec![
        Value::Okay,
        Value::BulkString(b"v".to_vec()),
        Value::Int(300),
    ]);
    ensure!(replies == there, "before expiry: {replies:?}");
    for con in cons.iter_mut() {
        eventually_blocking("x:short gone from every read", || {
            ensure!(value(con, &["GET", "x:short"])?.is_none(), "GET");
            ensure!(integer(con, &["EXISTS", "x:short"])? == 0, "EXISTS");
            ensure!(integer(con, &["TTL", "x:short"])? == -2, "TTL");
            let kind: String = query(con, &["TYPE", "x:short"])?;
            ensure!(kind == "none", "TYPE {kind}");
            let keys: Vec<String> = query(con, &["KEYS", "x:short*"])?;
            ensure!(keys.is_empty(), "KEYS {keys:?}");
            let scanned = scan_walk(con, "x:short*", None)?;
            ensure!(scanned.is_empty(), "SCAN {scanned:?}");
            Ok(())
        })?;
        eventually_blocking("the expire cycle removed x:short", || {
            let info: String = query(con, &["INFO", "keyspace"])?;
            ensure!(info.contains(",expires=0,"), "{info}");
            Ok(())
        })?;
    }
    Ok(())
}

/// TTL and PTTL count down; PERSIST keeps a key past its old deadline.
fn ttls_count_down_and_persist_keeps(cons: &mut [redis::Connection]) -> Result<()> {
    let _: () = query(&mut cons[0], &["SET", "x:t", "v", "EX", "100"])?;
    let ttl = integer(&mut cons[1], &["TTL", "x:t"])?;
    ensure!((98..=100).contains(&ttl), "TTL {ttl}");
    let first = integer(&mut cons[2], &["PTTL", "x:t"])?;
    ensure!((90_000..=100_000).contains(&first), "PTTL {first}");
    eventually_blocking("PTTL decreases", || {
        let now = integer(&mut cons[2], &["PTTL", "x:t"])?;
        ensure!((1..first).contains(&now), "PTTL {now} after {first}");
        Ok(())
    })?;
    // 2 s: PERSIST must reach the key before it expires, which 300 ms did
    // not always give a loaded machine (a full suite beside two builds).
    let _: () = query(&mut cons[0], &["SET", "x:kept", "v", "PX", "2000"])?;
    let _: () = query(&mut cons[0], &["SET", "x:gone", "v", "PX", "2000"])?;
    ensure!(integer(&mut cons[1], &["PERSIST", "x:kept"])? == 1);
    eventually_blocking("x:gone expired", || {
        ensure!(value(&mut cons[2], &["GET", "x:gone"])?.is_none());
        Ok(())
    })?;
    let kept = value(&mut cons[2], &["GET", "x:kept"])?;
    ensure!(
        kept.as_deref() == Some("v"),
        "x:kept after PERSIST: {kept:?}"
    );
    ensure!(integer(&mut cons[0], &["TTL", "x:kept"])? == -1);
    Ok(())
}

fn ensure_ttl_within(con: &mut redis::Connection, key: &str, seconds: i64) -> Result<()> {
    let ttl = integer(con, &["TTL", key])?;
    ensure!((1..=seconds).contains(&ttl), "TTL {key}: {ttl}");
    Ok(())
}

/// Which writes keep a key's TTL (KEEPTTL, INCR, APPEND, RENAME, GETEX
/// without an option) and which replace it (SET, SETEX, GETEX options).
fn writes_keep_or_replace_the_ttl(cons: &mut [redis::Connection]) -> Result<()> {
    let _: () = query(&mut cons[0], &["SET", "x:t", "v", "EX", "100"])?;
    let _: () = query(&mut cons[1], &["SET", "x:t", "v2"])?;
    ensure!(
        integer(&mut cons[2], &["TTL", "x:t"])? == -1,
        "SET kept a TTL"
    );
    let _: () = query(&mut cons[0], &["SET", "x:t", "v", "EX", "100"])?;
    let _: () = query(&mut cons[1], &["SET", "x:t", "v3", "KEEPTTL"])?;
    ensure_ttl_within(&mut cons[2], "x:t", 100)?;
    ensure!(value(&mut cons[0], &["GET", "x:t"])?.as_deref() == Some("v3"));
    let _: () = query(&mut cons[0], &["SET", "x:n", "1", "EX", "100"])?;
    ensure!(integer(&mut cons[1], &["INCR", "x:n"])? == 2);
    ensure_ttl_within(&mut cons[2], "x:n", 100)?;
    ensure!(integer(&mut cons[1], &["APPEND", "x:n", "0"])? == 2);
    ensure_ttl_within(&mut cons[2], "x:n", 100)?;
    let _: () = query(&mut cons[0], &["SETEX", "x:s", "100", "v"])?;
    ensure_ttl_within(&mut cons[1], "x:s", 100)?;
    let _: () = query(&mut cons[0], &["PSETEX", "x:s", "50000", "v"])?;
    ensure_ttl_within(&mut cons[1], "x:s", 50)?;
    let got = value(&mut cons[2], &["GETEX", "x:s"])?;
    ensure!(got.as_deref() == Some("v"), "GETEX {got:?}");
    ensure_ttl_within(&mut cons[1], "x:s", 50)?;
    let got = value(&mut cons[2], &["GETEX", "x:s", "PERSIST"])?;
    ensure!(got.as_deref() == Some("v"), "GETEX PERSIST {got:?}");
    ensure!(integer(&mut cons[0], &["TTL", "x:s"])? == -1);
    let got = value(&mut cons[2], &["GETEX", "x:s", "EX", "30"])?;
    ensure!(got.as_deref() == Some("v"), "GETEX EX {got:?}");
    ensure_ttl_within(&mut cons[0], "x:s", 30)?;
    let old = value(&mut cons[1], &["SET", "x:s", "w", "GET", "EX", "20"])?;
    ensure!(old.as_deref() == Some("v"), "SET GET EX {old:?}");
    ensure_ttl_within(&mut cons[0], "x:s", 20)?;
    let _: () = query(&mut cons[2], &["RENAME", "x:s", "x:r"])?;
    ensure_ttl_within(&mut cons[0], "x:r", 20)?;
    let _: () = query(&mut cons[1], &["DEL", "x:t", "x:n", "x:r"])?;
    Ok(())
}

fn expiry_over_time(addrs: &[SocketAddr]) -> Result<()> {
    let mut cons = connect_all(addrs)?;
    a_short_ttl_expires_everywhere(&mut cons)?;
    ttls_count_down_and_persist_keeps(&mut cons)?;
    writes_keep_or_replace_the_ttl(&mut cons)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_expiry_through_every_node() -> Result<()> {
    let mut cluster = Cluster::start(3)?;
    check_with_leader(&mut cluster, TEST_LIMIT_SECS, async |cluster, _| {
        let addrs = resp_addrs(cluster);
        for addr in addrs.clone() {
            tokio::task::spawn_blocking(move || expiry_errors(addr)).await??;
            tokio::task::spawn_blocking(move || expiry_replies(addr)).await??;
            tokio::task::spawn_blocking(move || expiry_inside_multi(addr)).await??;
        }
        tokio::task::spawn_blocking(move || expiry_over_time(&addrs)).await??;
        Ok(())
    })
    .await
}
