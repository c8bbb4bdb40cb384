//! `shm_reader`: one client process of the cross-process stress test
//! (`tests/tests/one_sided_stress.rs`).
//!
//! It GETs the given keys round-robin with a default [`Client`] (one-sided
//! `Lease` reads through `shm` on this host) and checks every value it gets
//! back: the value must name the key it was read for, its filler must be the
//! one derived from (key, seq), and per key the (version, seq) pairs must
//! never go backwards. It reads until its stdin closes (or `--max-secs`
//! passes), then prints one summary line on stdout and exits 1 if it saw a
//! wrong or backwards value.
//!
//! ```text
//! shm_reader --name r1 --endpoints 127.0.0.11:7000,127.0.0.12:7000 --keys hot-0,hot-1
//! ```
//!
//! The value format (kept in step with the writer in the test):
//! `<key>|<seq>|<filler>`, the filler being 16 to 1 024 lowercase letters drawn
//! from a generator seeded by the key and the sequence number.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rdkv_client::{Client, ClientOptions};

/// Wrong values reported in detail on stderr (the rest are only counted).
const REPORTED_WRONG: u64 = 10;

struct Args {
    name: String,
    endpoints: Vec<String>,
    keys: Vec<String>,
    max_secs: u64,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        name: "reader".to_owned(),
        endpoints: Vec::new(),
        keys: Vec::new(),
        max_secs: 60,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        let list = || value.split(',').map(str::to_owned).collect::<Vec<_>>();
        match flag.as_str() {
            "--name" => args.name = value.clone(),
            "--endpoints" => args.endpoints = list(),
            "--keys" => args.keys = list(),
            "--max-secs" => args.max_secs = value.parse().context("--max-secs")?,
            other => bail!("unknown flag {other}"),
        }
    }
    if args.endpoints.is_empty() || args.keys.is_empty() {
        bail!("usage: shm_reader --endpoints A,B,.. --keys K1,K2,.. [--name N] [--max-secs S]");
    }
    Ok(args)
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The filler of `key`'s value number `seq`.
fn filler(key: &[u8], seq: u64) -> Vec<u8> {
    let mut state = splitmix64(fnv1a(key) ^ seq.rotate_left(32));
    let len = 16 + (state % 1009) as usize;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        state = splitmix64(state);
        for b in state.to_le_bytes() {
            if out.len() < len {
                out.push(b'a' + b % 26);
            }
        }
    }
    out
}

/// Why a value is not one the writer wrote for this key.
fn check_value(key: &[u8], value: &[u8]) -> Result<u64, String> {
    let mut parts = value.splitn(3, |b| *b == b'|');
    let (Some(embedded), Some(seq), Some(fill)) = (parts.next(), parts.next(), parts.next()) else {
        return Err("not <key>|<seq>|<filler>".to_owned());
    };
    if embedded != key {
        return Err(format!(
            "value of key {:?}",
            String::from_utf8_lossy(embedded)
        ));
    }
    let seq: u64 = std::str::from_utf8(seq)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| "unparsable seq".to_owned())?;
    if fill != filler(key, seq).as_slice() {
        return Err(format!("filler of seq {seq} does not match"));
    }
    Ok(seq)
}

#[derive(Debug, Default)]
struct Tally {
    reads: u64,
    absent: u64,
    /// Reads that returned a newer version than the key's last one.
    advances: u64,
    errors: u64,
    wrong: u64,
    backwards: u64,
}

impl Tally {
    fn wrong(&mut self, name: &str, key: &str, what: &str) {
        self.wrong += 1;
        if self.wrong <= REPORTED_WRONG {
            eprintln!("{name}: WRONG value for {key}: {what}");
        }
    }

    fn backwards(&mut self, name: &str, key: &str, what: &str) {
        self.backwards += 1;
        if self.backwards <= REPORTED_WRONG {
            eprintln!("{name}: BACKWARDS for {key}: {what}");
        }
    }
}

async fn run(args: Args) -> Result<bool> {
    let stop = Arc::new(AtomicBool::new(false));
    {
        // The test closes our stdin to say "done".
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            stop.store(true, Ordering::Relaxed);
        });
    }
    let client = Client::new(&args.endpoints, ClientOptions::default())?;
    let name = args.name.as_str();
    let mut tally = Tally::default();
    // Per key: the highest (version, seq) seen so far.
    let mut last: HashMap<&str, (u64, u64)> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(args.max_secs);
    let mut ready = false;
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        let key = args.keys[i % args.keys.len()].as_str();
        i += 1;
        tally.reads += 1;
        let got = match client.get(key.to_owned()).await {
            Ok(got) => got,
            Err(e) => {
                tally.errors += 1;
                if tally.errors <= REPORTED_WRONG {
                    eprintln!("{name}: get {key}: {e}");
                }
                continue;
            }
        };
        let Some(got) = got else {
            tally.absent += 1;
            continue;
        };
        let seq = match check_value(key.as_bytes(), &got.value) {
            Ok(seq) => seq,
            Err(what) => {
                tally.wrong(name, key, &format!("{what} (version {})", got.version));
                continue;
            }
        };
        let now = (got.version, seq);
        match last.get(key).copied() {
            Some(before) if now.0 < before.0 => {
                tally.backwards(name, key, &format!("{now:?} after {before:?}"));
            }
            Some(before) if now.0 == before.0 && now.1 != before.1 => {
                tally.wrong(
                    name,
                    key,
                    &format!("version {} held seq {} and {}", now.0, before.1, now.1),
                );
            }
            Some(before) if now.0 > before.0 && now.1 <= before.1 => {
                tally.backwards(name, key, &format!("{now:?} after {before:?}"));
            }
            before => {
                if before.is_none_or(|b| now.0 > b.0) {
                    tally.advances += 1;
                }
                last.insert(key, now);
            }
        }
        if !ready && i >= args.keys.len() {
            // Every key read once: the regions are mapped.
            ready = true;
            println!("ready");
            std::io::stdout().flush()?;
        }
    }
    let stats = client.one_sided_stats().await;
    let r = stats.reads;
    println!(
        "summary reader={name} reads={} served={} fallbacks={} lease_refusals={} \
         retries_slot={} retries_block={} retries_invalidated={} retries_moved={} \
         retries_slow={} exhausted={} cache_hits={} cache_misses={} absent={} advances={} errors={} \
         wrong={} backwards={}",
        tally.reads,
        stats.served,
        stats.fallbacks,
        stats.lease_refusals,
        r.retries_slot,
        r.retries_block,
        r.retries_invalidated,
        r.retries_moved,
        r.retries_slow,
        r.exhausted,
        r.cache_hits,
        r.cache_misses,
        tally.absent,
        tally.advances,
        tally.errors,
        tally.wrong,
        tally.backwards,
    );
    std::io::stdout().flush()?;
    Ok(tally.wrong == 0 && tally.backwards == 0)
}

fn main() -> ExitCode {
    let result = parse_args().and_then(|args| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(run(args))
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("shm_reader: {e:#}");
            ExitCode::from(2)
        }
    }
}
