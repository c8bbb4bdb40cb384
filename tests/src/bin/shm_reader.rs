//! `shm_reader`: one client process of the cross-process stress test
//! (`rdkv_tests::stress`, run over shm by `tests/tests/one_sided_stress.rs`
//! and over ofi by `tests/tests/ofi.rs`).
//!
//! It GETs the given keys round-robin with a default [`Client`] (one-sided
//! `Lease` reads through `shm` on this host, or, built with the `ofi`
//! feature, by `fi_read` from nodes that offer no shm socket) and checks
//! every value it gets
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

#![forbid(unsafe_code)]

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

use rdkv_tests::stress_value::check as check_value;

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
