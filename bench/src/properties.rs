//! YCSB's property files (`-P file`, Java `.properties` syntax) and
//! single overrides (`-p name=value`); later sources win, as in YCSB.
//! Every value remembers where it came from, for error messages.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum PropertyError {
    #[error("cannot read property file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{origin}: line has no property name: {line:?}")]
    NoName { origin: Origin, line: String },
    #[error("-p {arg:?}: expected name=value")]
    BadOverride { arg: String },
    #[error("property {name} = {value:?} ({origin}): {expected}")]
    BadValue {
        name: String,
        value: String,
        origin: Origin,
        expected: String,
    },
}

/// Where a property was set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    File { path: PathBuf, line: usize },
    CommandLine,
    Default,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File { path, line } => write!(f, "{}:{line}", path.display()),
            Origin::CommandLine => write!(f, "-p on the command line"),
            Origin::Default => write!(f, "default"),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Properties {
    values: BTreeMap<String, (String, Origin)>,
}

impl Properties {
    pub fn new() -> Properties {
        Properties::default()
    }

    /// Reads a property file and adds (overrides) its values.
    pub fn load_file(&mut self, path: &Path) -> Result<(), PropertyError> {
        let text = std::fs::read_to_string(path).map_err(|source| PropertyError::Read {
            path: path.to_owned(),
            source,
        })?;
        self.load_str(&text, path)
    }

    /// Java `.properties` syntax: `#`/`!` comments, `name=value`,
    /// `name:value` or `name value`, surrounding blanks trimmed, a trailing
    /// backslash continues the line.
    pub fn load_str(&mut self, text: &str, path: &Path) -> Result<(), PropertyError> {
        let mut pending = String::new();
        let mut start_line = 0;
        for (index, raw) in text.lines().enumerate() {
            let line = raw.trim_start();
            if pending.is_empty() {
                start_line = index + 1;
                if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                    continue;
                }
            }
            let line = line.trim_end();
            if let Some(continued) = line.strip_suffix('\\') {
                pending.push_str(continued);
                continue;
            }
            pending.push_str(line);
            let logical = std::mem::take(&mut pending);
            let origin = Origin::File {
                path: path.to_owned(),
                line: start_line,
            };
            self.add_line(&logical, origin)?;
        }
        if !pending.is_empty() {
            let origin = Origin::File {
                path: path.to_owned(),
                line: start_line,
            };
            self.add_line(&pending, origin)?;
        }
        Ok(())
    }

    fn add_line(&mut self, line: &str, origin: Origin) -> Result<(), PropertyError> {
        let split = line.find(['=', ':', ' ', '\t']).unwrap_or(line.len());
        let name = line[..split].trim();
        if name.is_empty() {
            return Err(PropertyError::NoName {
                origin,
                line: line.to_owned(),
            });
        }
        let mut rest = line[split..].trim_start();
        if let Some(stripped) = rest.strip_prefix(['=', ':']) {
            rest = stripped.trim_start();
        }
        self.values
            .insert(name.to_owned(), (rest.to_owned(), origin));
        Ok(())
    }

    /// A `-p name=value` override.
    pub fn set_override(&mut self, arg: &str) -> Result<(), PropertyError> {
        let Some((name, value)) = arg.split_once('=') else {
            return Err(PropertyError::BadOverride {
                arg: arg.to_owned(),
            });
        };
        let name = name.trim();
        if name.is_empty() {
            return Err(PropertyError::BadOverride {
                arg: arg.to_owned(),
            });
        }
        self.values.insert(
            name.to_owned(),
            (value.trim().to_owned(), Origin::CommandLine),
        );
        Ok(())
    }

    pub fn set(&mut self, name: &str, value: &str) {
        self.values
            .insert(name.to_owned(), (value.to_owned(), Origin::CommandLine));
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(|(v, _)| v.as_str())
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.values.keys().map(String::as_str)
    }

    pub fn origin(&self, name: &str) -> Origin {
        self.values
            .get(name)
            .map_or(Origin::Default, |(_, origin)| origin.clone())
    }

    fn bad(&self, name: &str, value: &str, expected: &str) -> PropertyError {
        PropertyError::BadValue {
            name: name.to_owned(),
            value: value.to_owned(),
            origin: self.origin(name),
            expected: expected.to_owned(),
        }
    }

    pub fn string(&self, name: &str, default: &str) -> String {
        self.get(name).unwrap_or(default).to_owned()
    }

    /// A non-negative integer (YCSB counts and lengths).
    pub fn u64(&self, name: &str, default: u64) -> Result<u64, PropertyError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse::<u64>()
                .map_err(|_| self.bad(name, v, "expected a non-negative integer")),
        }
    }

    pub fn f64(&self, name: &str, default: f64) -> Result<f64, PropertyError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => match v.parse::<f64>() {
                Ok(x) if x.is_finite() => Ok(x),
                _ => Err(self.bad(name, v, "expected a number")),
            },
        }
    }

    /// A proportion: a number in [0, 1].
    pub fn fraction(&self, name: &str, default: f64) -> Result<f64, PropertyError> {
        let x = self.f64(name, default)?;
        if (0.0..=1.0).contains(&x) {
            Ok(x)
        } else {
            Err(self.bad(name, &x.to_string(), "expected a number between 0 and 1"))
        }
    }

    /// Java's `Boolean.parseBoolean` accepts anything (non-"true" is false);
    /// here only true/false, so a typo is not silently false.
    pub fn bool(&self, name: &str, default: bool) -> Result<bool, PropertyError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) if v.eq_ignore_ascii_case("true") => Ok(true),
            Some(v) if v.eq_ignore_ascii_case("false") => Ok(false),
            Some(v) => Err(self.bad(name, v, "expected true or false")),
        }
    }

    /// One of `choices`.
    pub fn choice(
        &self,
        name: &str,
        default: &str,
        choices: &[&str],
    ) -> Result<String, PropertyError> {
        let v = self.get(name).unwrap_or(default);
        if choices.contains(&v) {
            Ok(v.to_owned())
        } else {
            Err(self.bad(name, v, &format!("expected one of {}", choices.join(", "))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "\
# Yahoo! Cloud System Benchmark
! another comment style
   # indented comment

recordcount=1000
operationcount = 2000
workload=site.ycsb.workloads.CoreWorkload
readproportion: 0.5
requestdistribution zipfian
long=a\\
  b
";

    #[test]
    fn parses_comments_separators_and_continuations() {
        let mut p = Properties::new();
        p.load_str(FILE, Path::new("workloadx")).unwrap();
        assert_eq!(p.get("recordcount"), Some("1000"));
        assert_eq!(p.get("operationcount"), Some("2000"));
        assert_eq!(p.get("readproportion"), Some("0.5"));
        assert_eq!(p.get("requestdistribution"), Some("zipfian"));
        assert_eq!(p.get("long"), Some("ab"));
        assert_eq!(p.names().count(), 6);
        assert_eq!(
            p.origin("readproportion"),
            Origin::File {
                path: "workloadx".into(),
                line: 8
            }
        );
    }

    #[test]
    fn overrides_win_and_bad_overrides_are_refused() {
        let mut p = Properties::new();
        p.load_str("recordcount=1000\n", Path::new("w")).unwrap();
        p.set_override("recordcount=50").unwrap();
        assert_eq!(p.u64("recordcount", 0).unwrap(), 50);
        assert_eq!(p.origin("recordcount"), Origin::CommandLine);
        let err = p.set_override("recordcount").unwrap_err();
        assert_eq!(err.to_string(), "-p \"recordcount\": expected name=value");
        assert!(p.set_override("=5").is_err());
    }

    #[test]
    fn bad_values_name_the_property_and_its_origin() {
        let mut p = Properties::new();
        p.load_str(
            "recordcount=lots\nreadproportion=1.5\nreadallfields=yes\n",
            Path::new("w"),
        )
        .unwrap();
        let err = p.u64("recordcount", 0).unwrap_err().to_string();
        assert_eq!(
            err,
            "property recordcount = \"lots\" (w:1): expected a non-negative integer"
        );
        let err = p.fraction("readproportion", 0.0).unwrap_err().to_string();
        assert!(
            err.contains("between 0 and 1") && err.contains("w:2"),
            "{err}"
        );
        let err = p.bool("readallfields", true).unwrap_err().to_string();
        assert!(err.contains("true or false"), "{err}");
        let err = p
            .choice("requestdistribution", "pareto", &["uniform", "zipfian"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("uniform, zipfian") && err.contains("default"),
            "{err}"
        );
        assert_eq!(p.u64("missing", 7).unwrap(), 7);
    }

    #[test]
    fn a_line_without_a_name_is_an_error() {
        let mut p = Properties::new();
        let err = p.load_str("=5\n", Path::new("w")).unwrap_err().to_string();
        assert!(err.contains("w:1"), "{err}");
    }
}
