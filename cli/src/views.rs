//! What each command prints, in every format.

use std::time::Duration;

use rdkv_client::{KeyExpiry, MemberInfo, NodeStatus, RegionFill, Role, ShardStatus, Versioned};

use crate::output::{Json, Table, View, lines, show_bytes};

/// `put`: `OK`.
#[derive(Debug)]
pub struct PutView {
    pub version: u64,
}

impl View for PutView {
    fn simple(&self) -> String {
        "OK".to_owned()
    }

    fn table(&self) -> String {
        Table::of(["VERSION"], [[self.version.to_string()]])
    }

    fn json(&self) -> Json {
        Json::obj([("version", Json::U64(self.version))])
    }
}

/// `ttl`: a key's deadline, as Redis's PTTL counts it.
#[derive(Debug)]
pub struct TtlView {
    pub expiry: Option<KeyExpiry>,
}

impl TtlView {
    /// Milliseconds left; -1: never expires; -2: absent (PTTL's codes).
    fn pttl(&self) -> i64 {
        match self.expiry.as_ref().map(KeyExpiry::remaining_ms) {
            None => -2,
            Some(None) => -1,
            Some(Some(ms)) => i64::try_from(ms).unwrap_or(i64::MAX),
        }
    }
}

impl View for TtlView {
    fn simple(&self) -> String {
        self.pttl().to_string()
    }

    fn table(&self) -> String {
        let deadline = self
            .expiry
            .and_then(|e| e.deadline_unix_ms)
            .map_or_else(String::new, |d| d.to_string());
        Table::of(
            ["TTL_MS", "DEADLINE_UNIX_MS"],
            [[self.pttl().to_string(), deadline]],
        )
    }

    fn json(&self) -> Json {
        let deadline = self
            .expiry
            .and_then(|e| e.deadline_unix_ms)
            .map_or(Json::Null, Json::U64);
        // PTTL's codes as a number (an integral f64 prints without a
        // fraction), so that scripts test one field.
        Json::obj([
            ("ttl_ms", Json::F64(self.pttl() as f64)),
            ("deadline_unix_ms", deadline),
        ])
    }
}

/// The columns of `get` and `scan` tables.
const KV_HEADERS: [&str; 3] = ["KEY", "VALUE", "VERSION"];

/// A `get` or `scan` table row: `key`, its value and version.
fn kv_cells(key: &[u8], v: &Versioned) -> [String; 3] {
    [
        show_bytes(key).0.into_owned(),
        show_bytes(&v.value).0.into_owned(),
        v.version.to_string(),
    ]
}

/// `get`: the value, or nothing when the key is absent.
#[derive(Debug)]
pub struct GetView {
    pub key: Vec<u8>,
    pub value: Option<Versioned>,
}

impl View for GetView {
    fn simple(&self) -> String {
        self.value
            .as_ref()
            .map(|v| show_bytes(&v.value).0.into_owned())
            .unwrap_or_default()
    }

    fn table(&self) -> String {
        Table::of(
            KV_HEADERS,
            self.value.iter().map(|v| kv_cells(&self.key, v)),
        )
    }

    fn json(&self) -> Json {
        let mut fields = Vec::new();
        Json::push_bytes(&mut fields, "key", &self.key);
        match &self.value {
            Some(v) => {
                Json::push_bytes(&mut fields, "value", &v.value);
                fields.push(("version".into(), Json::U64(v.version)));
            }
            None => {
                fields.push(("value".into(), Json::Null));
                fields.push(("version".into(), Json::Null));
            }
        }
        Json::Obj(fields)
    }
}

/// `scan`: each pair as two lines, key then value (as `etcdctl get --prefix`).
#[derive(Debug)]
pub struct ScanView {
    pub pairs: Vec<(Vec<u8>, Versioned)>,
}

impl View for ScanView {
    fn simple(&self) -> String {
        lines(self.pairs.iter().flat_map(|(key, v)| {
            [
                show_bytes(key).0.into_owned(),
                show_bytes(&v.value).0.into_owned(),
            ]
        }))
    }

    fn table(&self) -> String {
        Table::of(
            KV_HEADERS,
            self.pairs.iter().map(|(key, v)| kv_cells(key, v)),
        )
    }

    fn json(&self) -> Json {
        let kvs = self
            .pairs
            .iter()
            .map(|(key, v)| {
                let mut fields = Vec::new();
                Json::push_bytes(&mut fields, "key", key);
                Json::push_bytes(&mut fields, "value", &v.value);
                fields.push(("version".into(), Json::U64(v.version)));
                Json::Obj(fields)
            })
            .collect();
        Json::obj([
            ("count", Json::U64(self.pairs.len() as u64)),
            ("kvs", Json::Arr(kvs)),
        ])
    }
}

/// `del`: how many keys were deleted (1 or 0), as etcdctl prints it.
#[derive(Debug)]
pub struct DelView {
    pub existed: bool,
    pub version: u64,
}

impl View for DelView {
    fn simple(&self) -> String {
        u8::from(self.existed).to_string()
    }

    fn table(&self) -> String {
        Table::of(
            ["DELETED", "VERSION"],
            [[u8::from(self.existed).to_string(), self.version.to_string()]],
        )
    }

    fn json(&self) -> Json {
        Json::obj([
            ("deleted", Json::U64(u64::from(self.existed))),
            ("version", Json::U64(self.version)),
        ])
    }
}

/// `member list` and the result of membership changes (`message` first in simple).
#[derive(Debug)]
pub struct MembersView {
    pub message: Option<String>,
    pub members: Vec<MemberInfo>,
}

impl View for MembersView {
    fn simple(&self) -> String {
        if let Some(message) = &self.message {
            return message.clone();
        }
        lines(
            self.members
                .iter()
                .map(|m| format!("{}, {}, {}, {}", m.id, m.peer_addr, m.client_addr, !m.voter)),
        )
    }

    fn table(&self) -> String {
        let table = Table::of(
            ["ID", "PEER ADDR", "CLIENT ADDR", "IS LEARNER"],
            self.members.iter().map(|m| {
                [
                    m.id.to_string(),
                    m.peer_addr.clone(),
                    m.client_addr.clone(),
                    (!m.voter).to_string(),
                ]
            }),
        );
        match &self.message {
            Some(message) => format!("{message}\n{table}"),
            None => table,
        }
    }

    fn json(&self) -> Json {
        let members = self
            .members
            .iter()
            .map(|m| {
                Json::obj([
                    ("id", Json::U64(m.id)),
                    ("peer_addr", Json::str(&m.peer_addr)),
                    ("client_addr", Json::str(&m.client_addr)),
                    ("is_learner", Json::Bool(!m.voter)),
                ])
            })
            .collect();
        let mut fields = Vec::new();
        if let Some(message) = &self.message {
            fields.push(("message".to_owned(), Json::str(message)));
        }
        fields.push(("members".to_owned(), Json::Arr(members)));
        Json::Obj(fields)
    }
}

/// One row of `endpoint status`.
#[derive(Debug, Clone)]
pub struct StatusRow {
    pub endpoint: String,
    pub status: NodeStatus,
    /// Entries behind the leader's log, when a leader's status says so.
    pub lag_entries: Option<u64>,
}

impl StatusRow {
    fn fill_percent(&self) -> Option<f64> {
        fill_percent(&self.status.region)
    }

    /// The charge as a share of the quota, once a quota is applied.
    fn quota_percent(&self) -> Option<f64> {
        let q = &self.status.quota;
        q.quota_bytes
            .filter(|&bytes| bytes > 0)
            .map(|bytes| q.charged_bytes as f64 * 100.0 / bytes as f64)
    }

    fn alarms(&self) -> String {
        let names: Vec<&str> = self.status.alarms.iter().map(|a| a.name()).collect();
        if names.is_empty() {
            "-".to_owned()
        } else {
            names.join(" ")
        }
    }

    fn cells(&self) -> Vec<String> {
        let s = &self.status;
        let mut cells = vec![self.endpoint.clone(), s.id.to_string()];
        cells.extend(raft_cells(
            s.role,
            s.term,
            s.leader_id,
            s.commit_index,
            s.applied_index,
        ));
        cells.extend([
            percent_cell(self.fill_percent()),
            percent_cell(self.quota_percent()),
            self.alarms(),
            self.lag_entries
                .map_or_else(|| "-".to_owned(), |l| l.to_string()),
            s.shm_socket.clone().unwrap_or_else(|| "-".to_owned()),
            transport_cell(&s.rdma),
            transport_cell(&s.ofi),
        ]);
        cells
    }
}

/// Role, term, leader, commit and applied index: the cells a node's and a
/// shard replica's status rows share.
fn raft_cells(
    role: Role,
    term: u64,
    leader: Option<u64>,
    commit: u64,
    applied: u64,
) -> [String; 5] {
    [
        role_name(role).to_owned(),
        term.to_string(),
        leader.map_or_else(|| "-".to_owned(), |l| l.to_string()),
        commit.to_string(),
        applied.to_string(),
    ]
}

/// How full a region is, in percent (`None`: no capacity).
pub(crate) fn fill_percent(r: &RegionFill) -> Option<f64> {
    (r.capacity_bytes > 0).then(|| r.used_bytes as f64 * 100.0 / r.capacity_bytes as f64)
}

/// A remote one-sided transport's state in a table cell: `on: <what>`
/// without the details in parentheses (the device's port and GID, the
/// libfabric version), or `off` (the reason is in `-w json`); `-` from a
/// node too old to say.
fn transport_cell(state: &str) -> String {
    if state.is_empty() {
        "-".to_owned()
    } else if state.starts_with("off") {
        "off".to_owned()
    } else {
        state.split(" (").next().unwrap_or(state).to_owned()
    }
}

/// Fills in each row's lag from the leader's replication progress, if a leader
/// is among the rows.
pub fn fill_lag(rows: &mut [StatusRow]) {
    let replication: Vec<(u64, u64)> = rows
        .iter()
        .filter(|r| r.status.role == Role::Leader)
        .flat_map(|r| r.status.replication.iter().map(|l| (l.id, l.lag_entries)))
        .collect();
    for row in rows {
        row.lag_entries = if row.status.role == Role::Leader {
            Some(0)
        } else {
            replication
                .iter()
                .find(|(id, _)| *id == row.status.id)
                .map(|&(_, lag)| lag)
        };
    }
}

pub fn role_name(role: Role) -> &'static str {
    match role {
        Role::Leader => "leader",
        Role::Follower => "follower",
        Role::Candidate => "candidate",
        Role::Learner => "learner",
        Role::Shutdown => "shutdown",
    }
}

/// `endpoint status`.
#[derive(Debug)]
pub struct StatusView {
    pub rows: Vec<StatusRow>,
    /// Every shard replica of the nodes that host several (endpoint, shard).
    pub shards: Vec<(String, ShardStatus)>,
}

/// One shard replica's cells: endpoint, shard, role, term, leader,
/// commit and applied index, region fill.
fn shard_cells((endpoint, s): &(String, ShardStatus)) -> Vec<String> {
    let mut cells = vec![endpoint.clone(), s.shard.to_string()];
    cells.extend(raft_cells(
        s.role,
        s.term,
        s.leader_id,
        s.commit_index,
        s.applied_index,
    ));
    cells.push(percent_cell(fill_percent(&s.region)));
    cells
}

/// A percentage with one decimal, `-` when unknown.
pub(crate) fn percent_cell(percent: Option<f64>) -> String {
    percent.map_or_else(|| "-".to_owned(), |p| format!("{p:.1}%"))
}

fn shard_json((endpoint, s): &(String, ShardStatus)) -> Json {
    Json::obj([
        ("endpoint", Json::str(endpoint)),
        ("shard", Json::U64(u64::from(s.shard.0))),
        ("role", Json::str(role_name(s.role))),
        ("term", Json::U64(s.term)),
        ("leader_id", Json::opt_u64(s.leader_id)),
        ("commit_index", Json::U64(s.commit_index)),
        ("applied_index", Json::U64(s.applied_index)),
        ("used_bytes", Json::U64(s.region.used_bytes)),
        ("capacity_bytes", Json::U64(s.region.capacity_bytes)),
        ("live_keys", Json::U64(s.region.live_keys)),
    ])
}

impl View for StatusView {
    fn simple(&self) -> String {
        let shards = self
            .shards
            .iter()
            .map(|row| format!("shard {}", shard_cells(row).join(", ")));
        lines(self.rows.iter().map(|r| r.cells().join(", ")).chain(shards))
    }

    fn table(&self) -> String {
        let headers = [
            "ENDPOINT",
            "ID",
            "ROLE",
            "TERM",
            "LEADER",
            "COMMIT INDEX",
            "APPLIED INDEX",
            "REGION FILL",
            "QUOTA USE",
            "ALARMS",
            "LAG",
            "SHM SOCKET",
            "RDMA",
            "OFI",
        ];
        let nodes = Table::of(headers, self.rows.iter().map(StatusRow::cells));
        if self.shards.is_empty() {
            return nodes;
        }
        let headers = [
            "ENDPOINT",
            "SHARD",
            "ROLE",
            "TERM",
            "LEADER",
            "COMMIT INDEX",
            "APPLIED INDEX",
            "REGION FILL",
        ];
        nodes + &Table::of(headers, self.shards.iter().map(shard_cells))
    }

    fn json(&self) -> Json {
        let nodes = self.nodes_json();
        if self.shards.is_empty() {
            return nodes;
        }
        Json::obj([
            ("nodes", nodes),
            (
                "shards",
                Json::Arr(self.shards.iter().map(shard_json).collect()),
            ),
        ])
    }
}

impl StatusView {
    /// One object per node (the whole `-w json` of a single-group cluster).
    fn nodes_json(&self) -> Json {
        Json::Arr(
            self.rows
                .iter()
                .map(|row| {
                    let s = &row.status;
                    Json::obj([
                        ("endpoint", Json::str(&row.endpoint)),
                        ("id", Json::U64(s.id)),
                        ("role", Json::str(role_name(s.role))),
                        ("term", Json::U64(s.term)),
                        ("leader_id", Json::opt_u64(s.leader_id)),
                        (
                            "leader_client_addr",
                            s.leader_client_addr.as_ref().map_or(Json::Null, Json::str),
                        ),
                        ("last_log_index", Json::U64(s.last_log_index)),
                        ("commit_index", Json::U64(s.commit_index)),
                        ("applied_index", Json::U64(s.applied_index)),
                        ("snapshot_index", Json::U64(s.snapshot_index)),
                        ("purged_index", Json::U64(s.purged_index)),
                        (
                            "region",
                            Json::obj([
                                ("capacity_bytes", Json::U64(s.region.capacity_bytes)),
                                ("used_bytes", Json::U64(s.region.used_bytes)),
                                (
                                    "pending_reclaim_bytes",
                                    Json::U64(s.region.pending_reclaim_bytes),
                                ),
                                ("live_keys", Json::U64(s.region.live_keys)),
                                (
                                    "fill_percent",
                                    row.fill_percent().map_or(Json::Null, Json::F64),
                                ),
                            ]),
                        ),
                        (
                            "quota",
                            Json::obj([
                                ("quota_bytes", Json::opt_u64(s.quota.quota_bytes)),
                                ("charged_bytes", Json::U64(s.quota.charged_bytes)),
                            ]),
                        ),
                        (
                            "alarms",
                            Json::Arr(s.alarms.iter().map(|a| Json::str(a.name())).collect()),
                        ),
                        ("lag_entries", Json::opt_u64(row.lag_entries)),
                        (
                            "shm_socket",
                            s.shm_socket.as_ref().map_or(Json::Null, Json::str),
                        ),
                        ("rdma", Json::str(&s.rdma)),
                        ("ofi", Json::str(&s.ofi)),
                    ])
                })
                .collect(),
        )
    }
}

/// One row of `endpoint health`.
#[derive(Debug, Clone)]
pub struct HealthRow {
    pub endpoint: String,
    pub healthy: bool,
    pub took: Duration,
    /// Why not healthy (the node's reason or the error reaching it).
    pub error: String,
}

/// `endpoint health`.
#[derive(Debug)]
pub struct HealthView {
    pub rows: Vec<HealthRow>,
}

impl View for HealthView {
    fn simple(&self) -> String {
        lines(self.rows.iter().map(|r| {
            if r.healthy {
                format!("{} is healthy: took = {:?}", r.endpoint, r.took)
            } else {
                format!("{} is unhealthy: {}", r.endpoint, r.error)
            }
        }))
    }

    fn table(&self) -> String {
        Table::of(
            ["ENDPOINT", "HEALTH", "TOOK", "ERROR"],
            self.rows.iter().map(|r| {
                [
                    r.endpoint.clone(),
                    r.healthy.to_string(),
                    format!("{:?}", r.took),
                    r.error.clone(),
                ]
            }),
        )
    }

    fn json(&self) -> Json {
        Json::Arr(
            self.rows
                .iter()
                .map(|r| {
                    Json::obj([
                        ("endpoint", Json::str(&r.endpoint)),
                        ("health", Json::Bool(r.healthy)),
                        ("took", Json::str(format!("{:?}", r.took))),
                        ("error", Json::str(&r.error)),
                    ])
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use rdkv_client::ReplicationLag;
    use rdkv_tests::fake_server::node_status;

    use super::*;
    use crate::output::{Format, render};

    fn status(id: u64, role: Role, replication: Vec<ReplicationLag>) -> NodeStatus {
        NodeStatus {
            replication,
            ..node_status(id, role)
        }
    }

    #[test]
    fn get_prints_the_value_or_nothing() {
        let found = GetView {
            key: b"k".to_vec(),
            value: Some(Versioned {
                value: Bytes::from_static(b"v\xff"),
                version: 3,
            }),
        };
        assert_eq!(render(&found, Format::Simple), "v\\xff\n");
        assert_eq!(
            render(&found, Format::Json),
            "{\"key\":\"k\",\"value\":\"v\\\\xff\",\"value_escaped\":true,\"version\":3}\n"
        );
        assert!(render(&found, Format::Table).contains("| k   | v\\xff | 3       |"));
        let missing = GetView {
            key: b"k".to_vec(),
            value: None,
        };
        assert_eq!(render(&missing, Format::Simple), "");
        assert_eq!(
            render(&missing, Format::Json),
            "{\"key\":\"k\",\"value\":null,\"version\":null}\n"
        );
    }

    #[test]
    fn put_and_del_print_like_etcdctl() {
        assert_eq!(render(&PutView { version: 9 }, Format::Simple), "OK\n");
        assert_eq!(
            render(&PutView { version: 9 }, Format::Json),
            "{\"version\":9}\n"
        );
        let del = DelView {
            existed: true,
            version: 10,
        };
        assert_eq!(render(&del, Format::Simple), "1\n");
        let del = DelView {
            existed: false,
            version: 11,
        };
        assert_eq!(render(&del, Format::Simple), "0\n");
    }

    #[test]
    fn members_list() {
        let view = MembersView {
            message: None,
            members: vec![
                MemberInfo {
                    id: 1,
                    peer_addr: "a:7380".into(),
                    client_addr: "a:7379".into(),
                    voter: true,
                },
                MemberInfo {
                    id: 2,
                    peer_addr: "bb:7380".into(),
                    client_addr: "bb:7379".into(),
                    voter: false,
                },
            ],
        };
        assert_eq!(
            render(&view, Format::Simple),
            "1, a:7380, a:7379, false\n2, bb:7380, bb:7379, true\n"
        );
        let table = render(&view, Format::Table);
        assert!(
            table.contains("| 2  | bb:7380   | bb:7379     | true       |"),
            "{table}"
        );
        assert!(render(&view, Format::Json).starts_with(
            "{\"members\":[{\"id\":1,\"peer_addr\":\"a:7380\",\"client_addr\":\"a:7379\",\"is_learner\":false}"
        ));
    }

    #[test]
    fn status_rows_show_fill_and_lag_from_the_leader() {
        let mut rows = vec![
            StatusRow {
                endpoint: "10.0.0.1:7379".into(),
                status: status(
                    1,
                    Role::Leader,
                    vec![ReplicationLag {
                        id: 2,
                        matched_index: Some(115),
                        lag_entries: 5,
                    }],
                ),
                lag_entries: None,
            },
            StatusRow {
                endpoint: "10.0.0.2:7379".into(),
                status: status(2, Role::Follower, Vec::new()),
                lag_entries: None,
            },
            StatusRow {
                endpoint: "10.0.0.3:7379".into(),
                status: status(3, Role::Learner, Vec::new()),
                lag_entries: None,
            },
        ];
        fill_lag(&mut rows);
        rows[1].status.quota = rdkv_proto::wire::QuotaUse {
            quota_bytes: Some(1000),
            charged_bytes: 950,
        };
        rows[1].status.alarms = vec![rdkv_proto::wire::Alarm::NoSpace];
        rows[0].status.ofi = "on: tcp;ofi_rxm (libfabric 1.17)".into();
        rows[0].status.rdma = "off: no RDMA device".into();
        rows[1].status.ofi = "off: libfabric unavailable: libfabric.so.1 not loadable".into();
        let view = StatusView {
            rows,
            shards: Vec::new(),
        };
        assert_eq!(
            render(&view, Format::Simple),
            "10.0.0.1:7379, 1, leader, 4, 1, 120, 118, 12.5%, -, -, 0, -, off, on: tcp;ofi_rxm\n\
             10.0.0.2:7379, 2, follower, 4, 1, 120, 118, 12.5%, 95.0%, NOSPACE, 5, -, -, off\n\
             10.0.0.3:7379, 3, learner, 4, 1, 120, 118, 12.5%, -, -, -, -, -, -\n"
        );
        let table = render(&view, Format::Table);
        let widths: Vec<usize> = table.lines().map(|l| l.chars().count()).collect();
        assert!(widths.iter().all(|&w| w == widths[0]), "{table}");
        let json = render(&view, Format::Json);
        assert!(json.contains("\"fill_percent\":12.5"), "{json}");
        assert!(json.contains("\"lag_entries\":5"), "{json}");
        assert!(json.contains("\"lag_entries\":null"), "{json}");
        assert!(json.contains("\"alarms\":[\"NOSPACE\"]"), "{json}");
        assert!(
            json.contains("\"ofi\":\"on: tcp;ofi_rxm (libfabric 1.17)\""),
            "{json}"
        );
        assert!(
            json.contains("\"ofi\":\"off: libfabric unavailable: libfabric.so.1 not loadable\""),
            "{json}"
        );
        assert!(
            json.contains("\"quota\":{\"quota_bytes\":1000,\"charged_bytes\":950}"),
            "{json}"
        );
    }

    #[test]
    fn health_lines() {
        let view = HealthView {
            rows: vec![
                HealthRow {
                    endpoint: "a:1".into(),
                    healthy: true,
                    took: Duration::from_millis(2),
                    error: String::new(),
                },
                HealthRow {
                    endpoint: "b:1".into(),
                    healthy: false,
                    took: Duration::from_millis(1),
                    error: "no leader".into(),
                },
            ],
        };
        assert_eq!(
            render(&view, Format::Simple),
            "a:1 is healthy: took = 2ms\nb:1 is unhealthy: no leader\n"
        );
        assert!(render(&view, Format::Json).contains("{\"endpoint\":\"b:1\",\"health\":false"));
    }
}
