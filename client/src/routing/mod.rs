//! The [`Router`]: sends a request where its kind may be served, following
//! redirects and retrying within the call's budget. The rules are
//! [`step::next_step`]; this module carries its steps out.

mod pool;
mod route;
mod shards;
mod step;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rdkv_fabric::rpc::RpcChannel;
use rdkv_proto::shard::{ShardId, ShardMap};
use rdkv_proto::wire::{ClientHello, KeyUse, Request, Response};
use tokio::time::{Instant, sleep_until};

use crate::error::{Error, Result};
use crate::options::ClientOptions;
pub(crate) use route::{Idempotence, Route, route_of};
use route::{RouteState, Target};
use shards::ShardRouting;
use step::{Attempt, BackOff, Outcome, Step, direct_result, next_step};

pub(crate) use pool::Pool;

const BACKOFF_START: Duration = Duration::from_millis(50);
/// An election takes a few hundred milliseconds (5 to 10 heartbeats): a client
/// backing off longer than that waits for nothing after a failover.
const BACKOFF_MAX: Duration = Duration::from_millis(250);

/// The connection pool and what the client knows of the cluster; shared by
/// every clone of a [`Client`](crate::Client).
#[derive(Debug)]
pub(crate) struct Router {
    options: ClientOptions,
    pool: Pool,
    state: Mutex<RouteState>,
    /// The shard map, fetched when a node says the client's is stale.
    shards: ShardRouting,
    /// Where the next follower read starts its round.
    spread: AtomicUsize,
    /// A node's hello was looked at for a shard map (`learn_map`).
    hello_seen: AtomicBool,
}

impl Router {
    /// A router over `endpoints` (trimmed, deduplicated); no I/O.
    pub(crate) fn new<S: AsRef<str>>(endpoints: &[S], options: ClientOptions) -> Result<Router> {
        let mut list: Vec<String> = Vec::new();
        for e in endpoints {
            let e = e.as_ref().trim();
            if !e.is_empty() && !list.iter().any(|x| x == e) {
                list.push(e.to_owned());
            }
        }
        if list.is_empty() {
            return Err(Error::NoEndpoints);
        }
        let hello = ClientHello::new(options.client_name.clone(), options.token.clone());
        let tls = options
            .tls
            .clone()
            .map(rdkv_tls::ClientTls::load)
            .transpose()?
            .map(Arc::new);
        Ok(Router {
            pool: Pool::new(hello, options.connect_timeout, tls),
            options,
            state: Mutex::new(RouteState::new(list)),
            shards: ShardRouting::default(),
            spread: AtomicUsize::new(0),
            hello_seen: AtomicBool::new(false),
        })
    }

    pub(crate) fn options(&self) -> &ClientOptions {
        &self.options
    }

    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    pub(crate) fn endpoints(&self) -> Vec<String> {
        self.state().endpoints.clone()
    }

    /// The node believed to lead (shard 0's leader in a sharded cluster).
    pub(crate) fn leader(&self) -> Option<String> {
        self.state().leader(ShardId(0)).cloned()
    }

    /// The newest shard map of several shards the client fetched (at
    /// connect, or when a node said the client's was stale); none: a
    /// single group.
    pub(crate) fn shard_map(&self) -> Option<Arc<ShardMap>> {
        self.shards.map()
    }

    /// Whether the map held has more than one shard.
    pub(crate) fn is_sharded(&self) -> bool {
        self.shards.is_sharded()
    }

    /// The shard whose log an answer to `request` speaks of (its applied
    /// index): a single group's, shard 0; under a map of several, the
    /// shard it names or its key's; `None` for a keyless request there
    /// (it goes to whichever node; its index is of no known log).
    pub(crate) fn log_of(&self, request: &Request) -> Option<ShardId> {
        match self.shards.map() {
            Some(map) if map.shards().len() > 1 => match request {
                Request::Sharded { shard, .. } => Some(*shard),
                _ => first_key(request).map(|key| map.shard_of_key(key)),
            },
            _ => Some(ShardId(0)),
        }
    }

    /// Where `request` goes under the map held: its key's shard, that
    /// shard's leader hint and members. Unsharded: the whole cluster.
    fn target(&self, request: &Request) -> Target {
        match self.shards.map() {
            Some(map) if map.shards().len() > 1 => target_in(&map, request),
            _ => Target::whole(),
        }
    }

    fn state(&self) -> MutexGuard<'_, RouteState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Connects to the first endpoint that answers, in order, so that a bad
    /// token or an unreachable cluster shows up before the first request.
    pub(crate) async fn connect_any(&self) -> Result<()> {
        let deadline = Instant::now() + self.options.request_timeout;
        let mut last_err = Error::NoEndpoints;
        for addr in self.endpoints() {
            match self.pool.connection(&addr, deadline).await {
                Ok(conn) => {
                    self.learn_announced_map(&addr, conn.as_ref(), deadline)
                        .await;
                    self.state().current = Some(addr);
                    return Ok(());
                }
                Err(e) if e.is_handshake_refusal() && !e.is_retryable() => return Err(e),
                Err(e) => last_err = e,
            }
        }
        Err(last_err)
    }

    /// Fetches the map a node announced in its hello, if it is newer than
    /// the one held: a sharded cluster's node announces its map's version
    /// (docs/sharding.md, section 5), so the map is known before the first
    /// request is routed, at no cost to a single group.
    async fn learn_announced_map(&self, addr: &str, conn: &dyn RpcChannel, deadline: Instant) {
        let learnt = match conn.shard_map_version() {
            Some(announced) if announced > self.shards.version() => {
                self.refresh_map(announced, addr, deadline).await
            }
            _ => Ok(()),
        };
        match learnt {
            Ok(()) => self.hello_seen.store(true, Ordering::Release),
            Err(error) => {
                tracing::debug!(%addr, %error, "the announced shard map could not be had")
            }
        }
    }

    /// Connects to a node (the one last talked to first) to learn whether
    /// it announces a shard map, once in the client's life: a call that
    /// splits by shard (scan, clear, mget, mput) must know the shards
    /// before it starts. No request is sent to a single group.
    pub(crate) async fn learn_map(&self) {
        if self.hello_seen.load(Ordering::Acquire) {
            return;
        }
        let deadline = Instant::now() + self.options.request_timeout;
        let mut order: Vec<String> = self.state().current.iter().cloned().collect();
        order.extend(self.endpoints());
        for addr in order {
            if let Ok(conn) = self.pool.connection(&addr, deadline).await {
                self.learn_announced_map(&addr, conn.as_ref(), deadline)
                    .await;
                return;
            }
        }
    }

    /// Asks for the newest map when the one held names a node without a
    /// client address: a new cluster's metadata group publishes the nodes'
    /// addresses in the versions after the first, and a reader needs every
    /// node's address to attach its regions.
    pub(crate) async fn complete_map(&self) {
        let Some(map) = self.shard_map() else {
            return;
        };
        if map.nodes().iter().all(|node| node.client_addr.is_some()) {
            return;
        }
        if let Ok(Response::ShardMap(newer)) = self.send(Request::ShardMap).await {
            self.shards.install(*newer);
        }
    }

    /// Sends `request` where its kind may be served ([`route_of`]).
    pub(crate) async fn send(&self, request: Request) -> Result<Response> {
        let moves_leader = matches!(request, Request::MoveLeader { .. });
        let (route, idempotence) = route_of(&request);
        let (_, response) = self.request_at(request, route, idempotence).await?;
        if moves_leader {
            // The old leader no longer leads; rediscover on the next write.
            self.state().leader_moved(ShardId(0));
        }
        Ok(response)
    }

    /// One request to exactly `addr`: no redirects, no retries elsewhere.
    pub(crate) async fn send_to(&self, addr: &str, request: Request) -> Result<Response> {
        let start = Instant::now();
        let outcome = self
            .attempt(addr, &request, start + self.options.request_timeout)
            .await;
        direct_result(outcome, addr, start.elapsed())
    }

    /// The frame limit of the channel to `addr`, if one can be had.
    pub(crate) async fn max_frame_bytes(&self, addr: &str) -> Option<u32> {
        let deadline = Instant::now() + self.options.request_timeout;
        let conn = self.pool.connection(addr, deadline).await.ok()?;
        Some(conn.max_frame_bytes())
    }

    async fn attempt(&self, addr: &str, request: &Request, deadline: Instant) -> Outcome {
        match self.pool.connection(addr, deadline).await {
            Err(e) => Outcome::Unreachable(e),
            Ok(conn) => call(conn.as_ref(), request, deadline).await,
        }
    }

    /// [`attempt`](Self::attempt) of a routed request: not sent if the
    /// node announced a newer shard map than the one it was routed under
    /// (it is fetched first, by the `Remap` step).
    async fn routed_attempt(&self, addr: &str, request: &Request, deadline: Instant) -> Outcome {
        let conn = match self.pool.connection(addr, deadline).await {
            Err(e) => return Outcome::Unreachable(e),
            Ok(conn) => conn,
        };
        match conn.shard_map_version() {
            Some(announced) if announced > self.shards.version() => {
                Outcome::MapAnnounced(announced)
            }
            _ => call(conn.as_ref(), request, deadline).await,
        }
    }

    /// Sends `request` where `route` allows, retrying and redirecting within
    /// the request timeout and attempt budget. Returns the answering node's
    /// address with the response.
    pub(crate) async fn request_at(
        &self,
        request: Request,
        route: Route,
        idempotence: Idempotence,
    ) -> Result<(String, Response)> {
        let cursor = match route {
            Route::AnySpread => self.spread.fetch_add(1, Ordering::Relaxed),
            Route::Leader | Route::AnyPreferLeader => 0,
        };
        let mut call = Call::new(self.options.request_timeout, cursor);
        let mut attempt = 0;
        while attempt < self.options.max_attempts.max(1) {
            attempt += 1;
            // The map may change between attempts (a `Remap`).
            let target = self.target(&request);
            let addr = call
                .next
                .take()
                .unwrap_or_else(|| self.state().pick(route, call.cursor, &target));
            let map_version = self.shards.version();
            let outcome = self.routed_attempt(&addr, &request, call.deadline).await;
            let facts = Attempt {
                addr: &addr,
                idempotence,
                request_timeout: self.options.request_timeout,
                elapsed: call.start.elapsed(),
                past_deadline: Instant::now() >= call.deadline,
                earlier_error: call.last_err.is_some(),
            };
            let then = match next_step(outcome, &facts) {
                Step::Remap { at_least } => {
                    let versions = (at_least, map_version);
                    self.remap(versions, target.shard, &addr, &mut call, &mut attempt)
                        .await
                }
                step => self.follow(step, &addr, (route, &target), &mut call),
            };
            match then {
                Then::Return(result) => return result.map(|response| (addr, response)),
                Then::Stop => break,
                Then::Next { wait } => {
                    tracing::debug!(%addr, attempt, last_error = ?call.last_err, "trying again");
                    if wait {
                        call.back_off().await;
                    }
                    if Instant::now() >= call.deadline {
                        break;
                    }
                }
            }
        }
        // The last thing that went wrong says more than "timed out" (an unreachable
        // node, no leader, Unavailable); nothing was sent whose outcome is unknown.
        Err(call
            .last_err
            .unwrap_or_else(|| Error::Timeout(call.start.elapsed())))
    }

    /// Carries out a `Remap` step: `addr` answered `WrongShard` to a request
    /// sent under map `sent_under`. When the map is brought past that
    /// version the request goes again at once and the attempt is not
    /// counted (nothing was proposed, the client only learnt); otherwise
    /// (the node is no newer than the client, or no map could be fetched)
    /// it is a failed attempt, retried after a back-off.
    async fn remap(
        &self,
        (at_least, sent_under): (u64, u64),
        shard: ShardId,
        addr: &str,
        call: &mut Call,
        attempt: &mut u32,
    ) -> Then {
        tracing::debug!(%addr, at_least, sent_under, "stale shard map");
        match self.refresh_map(at_least, addr, call.deadline).await {
            Ok(()) if sent_under < at_least => {
                *attempt -= 1;
                Then::Next { wait: false }
            }
            Ok(()) => {
                // No newer map: the node no longer serves the shard (its
                // replica moved away; the map changes later), so its
                // other members are tried, whose redirects name the leader.
                self.state().not_serving(addr, shard);
                call.last_err = Some(Error::StaleShardMap {
                    needed: at_least,
                    held: self.shards.version(),
                });
                Then::Next { wait: true }
            }
            Err(error) => {
                call.last_err = Some(error);
                Then::Next { wait: true }
            }
        }
    }

    /// Brings the shard map to at least `at_least`, asking `first` (which
    /// said it has that version), then the other endpoints. One refresh at
    /// a time: calls that waited for it find its map and fetch nothing.
    async fn refresh_map(&self, at_least: u64, first: &str, deadline: Instant) -> Result<()> {
        let held = || Error::StaleShardMap {
            needed: at_least,
            held: self.shards.version(),
        };
        let _turn = tokio::time::timeout_at(deadline, self.shards.refresh_turn())
            .await
            .map_err(|_| held())?;
        if self.shards.version() >= at_least {
            return Ok(());
        }
        let mut order = vec![first.to_owned()];
        order.extend(self.endpoints().into_iter().filter(|e| e != first));
        let mut last_err = held();
        for addr in order {
            let start = Instant::now();
            let outcome = self.attempt(&addr, &Request::ShardMap, deadline).await;
            match direct_result(outcome, &addr, start.elapsed()) {
                Ok(Response::ShardMap(map)) => {
                    if self.shards.install(*map) {
                        // The new map's leader hints are fresher than what
                        // was learnt under the old one.
                        self.state().forget_leaders();
                    }
                    if self.shards.version() >= at_least {
                        return Ok(());
                    }
                    last_err = held();
                }
                Ok(other) => {
                    last_err = Error::UnexpectedResponse {
                        request: "ShardMap",
                        response: format!("{other:?}"),
                    }
                }
                Err(error) => last_err = error,
            }
            if Instant::now() >= deadline {
                break;
            }
        }
        Err(last_err)
    }

    /// Carries out `step` of `call`, whose last attempt went to `addr`
    /// by `route` for `target`.
    fn follow(&self, step: Step, addr: &str, to: (Route, &Target), call: &mut Call) -> Then {
        let (route, target) = to;
        match step {
            Step::Done(response) => {
                self.state().answered(addr, route, target.shard);
                Then::Return(Ok(response))
            }
            Step::Fail { error, suspect } => {
                if suspect {
                    self.state().suspect(addr);
                }
                Then::Return(Err(error))
            }
            Step::GiveUp => Then::Stop,
            // Carried out by `remap`, which must wait for the refresh.
            Step::Remap { .. } => Then::Next { wait: true },
            Step::Redirect { to, error } => {
                tracing::debug!(from = %addr, %to, "redirecting to the leader");
                self.state().learn_leader(&to, target.shard);
                call.next = Some(to);
                call.last_err = Some(error);
                call.redirects += 1;
                // Nodes that disagree about the leader (stale hints) must not spin.
                Then::Next {
                    wait: call.redirects > 1,
                }
            }
            Step::Retry {
                error,
                skip_node,
                back_off,
            } => {
                if skip_node {
                    // No connection to it: tried after the others for a
                    // while, even where the map names it leader.
                    self.state().suspect(addr);
                    call.cursor = call.cursor.wrapping_add(1);
                }
                call.last_err = Some(error);
                Then::Next {
                    wait: back_off == BackOff::Always
                        || self.state().round_done(call.cursor, target),
                }
            }
        }
    }
}

/// One call's progress across its attempts.
#[derive(Debug)]
struct Call {
    start: Instant,
    deadline: Instant,
    /// Which endpoint the next fallback tries.
    cursor: usize,
    /// The next sleep between attempts.
    backoff: Duration,
    /// What to report if the budget runs out.
    last_err: Option<Error>,
    /// The node to try next, when a redirect named one.
    next: Option<String>,
    redirects: u32,
}

impl Call {
    fn new(request_timeout: Duration, cursor: usize) -> Call {
        let start = Instant::now();
        Call {
            start,
            deadline: start + request_timeout,
            cursor,
            backoff: BACKOFF_START,
            last_err: None,
            next: None,
            redirects: 0,
        }
    }

    /// Sleeps for the current back-off (never past the deadline) and doubles it.
    async fn back_off(&mut self) {
        let wake = (Instant::now() + self.backoff).min(self.deadline);
        sleep_until(wake).await;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
    }
}

/// What the request loop does after a step.
enum Then {
    Return(Result<Response>),
    Stop,
    /// Another attempt, after a back-off when `wait`.
    Next {
        wait: bool,
    },
}

/// One call of `request` on `conn`.
async fn call(conn: &dyn RpcChannel, request: &Request, deadline: Instant) -> Outcome {
    match conn.call_boxed(request, deadline).await {
        Ok(response) => Outcome::Replied(response),
        Err(failure) => Outcome::CallFailed(failure),
    }
}

/// [`Router::target`] under a map of several shards: the shard a
/// `Sharded` request names, else the shard of the request's first key
/// (keyless requests: shard 0), with the client addresses the map gives
/// for its leader and members.
fn target_in(map: &ShardMap, request: &Request) -> Target {
    let shard = match request {
        Request::Sharded { shard, .. } => *shard,
        _ => first_key(request).map_or(ShardId(0), |key| map.shard_of_key(key)),
    };
    let Some(info) = map.shard(shard) else {
        return Target::whole();
    };
    let addr = |id| map.node(id).and_then(|node| node.client_addr.clone());
    Target {
        shard,
        hint: info.leader.and_then(addr),
        members: info.members.iter().filter_map(|&id| addr(id)).collect(),
    }
}

/// The first key a request touches, if it touches any by name.
fn first_key(request: &Request) -> Option<&[u8]> {
    match request.key_use() {
        KeyUse::Reads(keys) | KeyUse::Writes(keys) => keys.first().map(|key| &key[..]),
        KeyUse::Nothing | KeyUse::Everything => None,
    }
}
