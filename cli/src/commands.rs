//! Runs one command against the cluster and returns what to print.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rdkv_client::{Client, ClientOptions, ClientTlsFiles};

use rdkv_proto::shard::ShardId;

use crate::args::{
    Command, EndpointCommand, Global, MemberCommand, NodeCommand, ShardCommand, SnapshotCommand,
    arg_bytes,
};
use crate::check::CheckView;
use crate::output::{Json, Message, View};
use crate::rebalance;
use crate::shards::{self, ShardListView, ShardsState};
use crate::views::{
    DelView, GetView, HealthRow, HealthView, MembersView, PutView, ScanView, StatusRow, StatusView,
    TtlView, fill_lag,
};

/// What a command produced: something to print, and whether it failed anyway
/// (e.g. an unhealthy endpoint), reported on stderr after the output.
pub struct Outcome {
    pub view: Box<dyn View>,
    pub failure: Option<anyhow::Error>,
}

impl Outcome {
    fn ok(view: impl View + 'static) -> Self {
        Self {
            view: Box::new(view),
            failure: None,
        }
    }
}

fn message(text: String, json: Json) -> Outcome {
    Outcome::ok(Message { text, json })
}

/// Commands that read or write local files only: run without a client.
pub fn run_local(command: &Command) -> Option<Result<Outcome>> {
    let Command::Snapshot(snapshot) = command else {
        return None;
    };
    match snapshot {
        SnapshotCommand::Save { .. } => None,
        SnapshotCommand::Status { file } => Some(crate::backup::status(file).map(Outcome::ok)),
        SnapshotCommand::Restore {
            file,
            data_dir,
            id,
            initial_cluster,
            cluster_name,
            node,
        } => {
            let member = crate::backup::Member {
                data_dir,
                id: *id,
                initial_cluster,
                cluster_name,
                size: *node,
            };
            Some(crate::backup::restore(file, &member).map(Outcome::ok))
        }
    }
}

pub fn client(global: &Global) -> Result<Client> {
    let options = ClientOptions {
        token: global.token.clone().filter(|t| !t.is_empty()),
        request_timeout: global.timeout,
        connect_timeout: global.timeout.min(Duration::from_secs(2)),
        client_name: concat!("rdkvctl/", env!("CARGO_PKG_VERSION")).to_owned(),
        tls: ClientTlsFiles::from_settings(
            global.tls_ca.clone(),
            global.tls_cert.clone(),
            global.tls_key.clone(),
            global.tls_server_name.clone(),
        )
        .context("TLS flags")?,
        ..ClientOptions::default()
    };
    Client::new(&global.endpoints, options).context("creating the client (--endpoints, --tls-*)")
}

pub async fn run(client: &Client, command: Command) -> Result<Outcome> {
    match command {
        Command::Put { key, value, ttl } => {
            let (key, value) = (arg_bytes(key), arg_bytes(value));
            let version = match ttl {
                None => client.put(key, value).await,
                Some(ttl) => client.put_with_ttl(key, value, ttl).await,
            }
            .context("put failed")?;
            Ok(Outcome::ok(PutView { version }))
        }
        Command::Ttl { key } => {
            let expiry = client.ttl(arg_bytes(key)).await.context("ttl failed")?;
            Ok(Outcome::ok(TtlView { expiry }))
        }
        Command::Get {
            key,
            consistency,
            max_lag,
        } => {
            let key = arg_bytes(key);
            let consistency = consistency.level(max_lag);
            let value = client
                .get_with(key.clone(), consistency)
                .await
                .context("get failed")?;
            Ok(Outcome::ok(GetView { key, value }))
        }
        Command::Scan {
            start,
            end,
            limit,
            consistency,
            max_lag,
        } => {
            let pairs = client
                .scan_range(
                    arg_bytes(start),
                    end.map(|end| arg_bytes(end).into()),
                    limit,
                    consistency.level(max_lag),
                )
                .await
                .context("scan failed")?;
            Ok(Outcome::ok(ScanView {
                pairs: pairs.into_iter().map(|(k, v)| (k.to_vec(), v)).collect(),
            }))
        }
        Command::Del { key } => {
            let deleted = client.delete(arg_bytes(key)).await.context("del failed")?;
            Ok(Outcome::ok(DelView {
                existed: deleted.existed,
                version: deleted.version,
            }))
        }
        Command::Member(command) => member(client, command).await,
        Command::Endpoint(EndpointCommand::Status { cluster }) => {
            let endpoints = targets(client, cluster).await?;
            endpoint_status(client, endpoints).await
        }
        Command::Endpoint(EndpointCommand::Health { cluster }) => {
            let endpoints = targets(client, cluster).await?;
            Ok(endpoint_health(client, endpoints).await)
        }
        Command::Check => check(client).await,
        Command::MoveLeader { id } => {
            client
                .move_leader(id)
                .await
                .with_context(|| format!("moving the leadership to member {id} failed"))?;
            Ok(message(
                format!("Leadership transferred to member {id}"),
                Json::obj([("leader_id", Json::U64(id))]),
            ))
        }
        Command::Shard(command) => shard(client, command).await,
        Command::Node(NodeCommand::Remove { id }) => {
            let (text, json) = crate::nodes::remove(client, id).await?;
            Ok(message(text, json))
        }
        Command::Rebalance { dry_run } => {
            Ok(Outcome::ok(rebalance::rebalance(client, dry_run).await?))
        }
        Command::Top { .. } => bail!("top runs on its own (see main)"),
        Command::Snapshot(SnapshotCommand::Status { .. } | SnapshotCommand::Restore { .. }) => {
            bail!("snapshot status and restore run locally (see run_local)")
        }
        Command::Snapshot(SnapshotCommand::Save { file }) => snapshot_save(client, &file).await,
    }
}

async fn snapshot_save(client: &Client, file: &std::path::Path) -> Result<Outcome> {
    let info = client
        .snapshot_to_file(file)
        .await
        .with_context(|| format!("saving a snapshot to {} failed", file.display()))?;
    Ok(message(
        format!(
            "Snapshot saved at {} ({} bytes, last log index {})",
            file.display(),
            info.total_bytes,
            info.last_log_index
        ),
        Json::obj([
            ("path", Json::str(file.display().to_string())),
            ("total_bytes", Json::U64(info.total_bytes)),
            ("last_log_index", Json::U64(info.last_log_index)),
        ]),
    ))
}

async fn shard(client: &Client, command: ShardCommand) -> Result<Outcome> {
    let state = ShardsState::gather(client).await?;
    match command {
        ShardCommand::List => Ok(Outcome::ok(ShardListView { state })),
        ShardCommand::MoveLeader { shard, node } => {
            shards::move_leader(client, &state, ShardId(shard), node).await?;
            Ok(message(
                format!("Shard {shard}'s leadership transferred to node {node}"),
                Json::obj([
                    ("shard", Json::U64(u64::from(shard))),
                    ("leader_id", Json::U64(node)),
                ]),
            ))
        }
        ShardCommand::MoveReplica { shard, from, to } => {
            let members = shards::move_replica(client, &state, ShardId(shard), (from, to)).await?;
            let voters: Vec<u64> = members.iter().filter(|m| m.voter).map(|m| m.id).collect();
            Ok(message(
                format!(
                    "Shard {shard}'s replica moved from node {from} to node {to}: members {voters:?}"
                ),
                Json::obj([
                    ("shard", Json::U64(u64::from(shard))),
                    ("from", Json::U64(from)),
                    ("to", Json::U64(to)),
                    (
                        "members",
                        Json::Arr(voters.into_iter().map(Json::U64).collect()),
                    ),
                ]),
            ))
        }
    }
}

async fn member(client: &Client, command: MemberCommand) -> Result<Outcome> {
    // Each change: its result, what failed, and what was done.
    let (result, failed, done) = match command {
        MemberCommand::List => {
            let members = client.members().await.context("listing members failed")?;
            return Ok(Outcome::ok(MembersView {
                message: None,
                members,
            }));
        }
        MemberCommand::Add {
            id,
            peer_addr,
            client_addr,
            learner,
        } => {
            let role = if learner {
                "as a learner"
            } else {
                "(a voter once caught up)"
            };
            (
                client.add_member(id, peer_addr, client_addr, learner).await,
                format!("adding member {id} failed"),
                format!("Member {id} added {role}"),
            )
        }
        MemberCommand::Promote { id } => (
            client.promote_member(id).await,
            format!("promoting member {id} failed"),
            format!("Member {id} promoted to voter"),
        ),
        MemberCommand::Remove { id } => (
            client.remove_member(id).await,
            format!("removing member {id} failed"),
            format!("Member {id} removed"),
        ),
    };
    Ok(Outcome::ok(MembersView {
        message: Some(done),
        members: result.context(failed)?,
    }))
}

/// `--endpoints`, or with `--cluster` every member's client address.
async fn targets(client: &Client, cluster: bool) -> Result<Vec<String>> {
    if !cluster {
        return Ok(client.endpoints());
    }
    let members = client
        .members()
        .await
        .context("--cluster: listing members failed")?;
    let mut addrs: Vec<String> = members.into_iter().map(|m| m.client_addr).collect();
    addrs.dedup();
    if addrs.is_empty() {
        bail!("--cluster: the member list is empty");
    }
    Ok(addrs)
}

/// Asks every endpoint at once; results come back in endpoint order.
async fn each<T, F, Fut>(client: &Client, endpoints: Vec<String>, ask: F) -> Vec<(String, T)>
where
    T: Send + 'static,
    F: Fn(Client, String) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    let mut tasks = tokio::task::JoinSet::new();
    for (i, endpoint) in endpoints.iter().enumerate() {
        let fut = ask(client.clone(), endpoint.clone());
        tasks.spawn(async move { (i, fut.await) });
    }
    let mut results: Vec<Option<T>> = endpoints.iter().map(|_| None).collect();
    while let Some(joined) = tasks.join_next().await {
        if let Ok((i, value)) = joined
            && let Some(slot) = results.get_mut(i)
        {
            *slot = Some(value);
        }
    }
    endpoints
        .into_iter()
        .zip(results)
        .filter_map(|(e, r)| r.map(|r| (e, r)))
        .collect()
}

/// Rows for the endpoints that answered; the others are reported as the failure
/// (printed on stderr, exit code 1), as etcdctl does.
async fn endpoint_status(client: &Client, endpoints: Vec<String>) -> Result<Outcome> {
    let results = each(client, endpoints, |client, endpoint| async move {
        let status = client.status_of(&endpoint).await?;
        // A node older than shard status serves one group: no shard rows.
        let shards = client
            .shard_statuses_of(&endpoint)
            .await
            .unwrap_or_default();
        Ok::<_, rdkv_client::Error>((status, shards))
    })
    .await;
    let mut rows = Vec::new();
    let mut shard_rows = Vec::new();
    let mut errors = Vec::new();
    for (endpoint, result) in results {
        match result {
            Ok((status, shards)) => {
                if shards.len() > 1 {
                    shard_rows.extend(shards.into_iter().map(|s| (endpoint.clone(), s)));
                }
                rows.push(StatusRow {
                    endpoint,
                    status,
                    lag_entries: None,
                });
            }
            Err(e) => errors.push(format!("{endpoint}: {}", chain(&e))),
        }
    }
    if rows.is_empty() {
        bail!(
            "failed to get the status of every endpoint: {}",
            errors.join("; ")
        );
    }
    fill_lag(&mut rows);
    let failure = (!errors.is_empty()).then(|| {
        anyhow::anyhow!(
            "failed to get the status of {} endpoint(s): {}",
            errors.len(),
            errors.join("; ")
        )
    });
    Ok(Outcome {
        view: Box::new(StatusView {
            rows,
            shards: shard_rows,
        }),
        failure,
    })
}

/// `check`: every member's digest history, compared at a common index.
async fn check(client: &Client) -> Result<Outcome> {
    let endpoints = targets(client, true).await?;
    let answers = each(client, endpoints, |client, endpoint| async move {
        client.digests_of(&endpoint).await
    })
    .await;
    let mut histories = Vec::new();
    for (endpoint, answer) in answers {
        let history = answer.with_context(|| format!("{endpoint}: reading its state digests"))?;
        histories.push((endpoint, history));
    }
    let view = CheckView::compare(histories);
    let failure = (!view.agrees()).then(|| match view.common_index {
        Some(index) => anyhow::anyhow!("the members' states differ at applied index {index}"),
        None => anyhow::anyhow!("no applied index is held by every member; retry"),
    });
    Ok(Outcome {
        view: Box::new(view),
        failure,
    })
}

async fn endpoint_health(client: &Client, endpoints: Vec<String>) -> Outcome {
    let rows: Vec<HealthRow> = each(client, endpoints, |client, endpoint| async move {
        let start = Instant::now();
        let result = client.health_of(&endpoint).await;
        let took = start.elapsed();
        match result {
            Ok(health) => HealthRow {
                endpoint,
                healthy: health.healthy,
                took,
                error: health.reason,
            },
            Err(e) => HealthRow {
                endpoint,
                healthy: false,
                took,
                error: chain(&e),
            },
        }
    })
    .await
    .into_iter()
    .map(|(_, row)| row)
    .collect();
    let unhealthy = rows.iter().filter(|r| !r.healthy).count();
    let failure = (unhealthy > 0).then(|| {
        anyhow::anyhow!(
            "unhealthy cluster: {unhealthy} of {} endpoint(s)",
            rows.len()
        )
    });
    Outcome {
        view: Box::new(HealthView { rows }),
        failure,
    }
}

/// An error and its causes on one line, like anyhow's `{:#}`.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
