//! The `--initial-cluster` list (`ID=HOST:PORT,...`), as `rdkv-server`
//! takes it to start a cluster and `rdkvctl snapshot restore` to restore one.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum MembersError {
    #[error("initial-cluster entry {0:?} is not ID=PEER_ADDR")]
    NotAnEntry(String),
    #[error("initial-cluster id {0:?} is not a number")]
    BadId(String),
    #[error("initial-cluster ids start at 1")]
    ZeroId,
    #[error("initial-cluster address {0:?} is not HOST:PORT")]
    BadAddr(String),
    #[error("initial-cluster names node {0} twice")]
    Twice(u64),
    #[error("initial-cluster is empty")]
    Empty,
}

/// Member id -> peer address, from `ID=HOST:PORT` entries separated by commas.
pub fn parse_initial_cluster(spec: &str) -> Result<BTreeMap<u64, String>, MembersError> {
    let mut members = BTreeMap::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .ok_or_else(|| MembersError::NotAnEntry(part.to_owned()))?;
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|_| MembersError::BadId(id.to_owned()))?;
        if id == 0 {
            return Err(MembersError::ZeroId);
        }
        let addr: SocketAddr = addr
            .trim()
            .parse()
            .map_err(|_| MembersError::BadAddr(addr.to_owned()))?;
        if members.insert(id, addr.to_string()).is_some() {
            return Err(MembersError::Twice(id));
        }
    }
    if members.is_empty() {
        return Err(MembersError::Empty);
    }
    Ok(members)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_checked_one_by_one() {
        let members = parse_initial_cluster("1=127.0.0.1:7380, 2=127.0.0.2:7380").unwrap();
        assert_eq!(members[&2], "127.0.0.2:7380");
        assert_eq!(
            parse_initial_cluster("1=a:1"),
            Err(MembersError::BadAddr("a:1".into()))
        );
        assert_eq!(
            parse_initial_cluster("1=127.0.0.1:1,1=127.0.0.1:2"),
            Err(MembersError::Twice(1))
        );
        assert_eq!(parse_initial_cluster(" , "), Err(MembersError::Empty));
        assert_eq!(
            parse_initial_cluster("0=127.0.0.1:1"),
            Err(MembersError::ZeroId)
        );
    }
}
