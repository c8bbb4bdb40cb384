//! The command line of the examples: `--name N` pairs of numbers.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};

/// Every `--name N` pair of the process's arguments; a name not in `known`,
/// a flag without a value or a value that is not a number is an error.
pub fn numeric_flags(known: &[&str]) -> Result<BTreeMap<String, u64>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut flags = BTreeMap::new();
    for pair in args.chunks(2) {
        let [flag, value] = pair else {
            bail!("flags take a value: {args:?}");
        };
        if !known.contains(&flag.as_str()) {
            bail!("unknown flag {flag} (known: {})", known.join(", "));
        }
        let number: u64 = value.parse().with_context(|| format!("{flag} {value}"))?;
        flags.insert(flag.clone(), number);
    }
    Ok(flags)
}
