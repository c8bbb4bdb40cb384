//! Key expiry: SETEX, PSETEX, EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT,
//! PERSIST, TTL, PTTL, EXPIRETIME, PEXPIRETIME, GETEX, GETDEL, and the
//! expiry options SET and GETEX share.
//!
//! The state machine decides (`Update::Set`, `Expire`, `GetEx`, `GetDel`):
//! a relative time counts from the wall clock the leader stamps on the log
//! entry, so every replica computes the same deadline. Here the arguments
//! are checked as Redis 7 checks them, with its error replies; the local
//! clock is only used for Redis's overflow check of a relative time.

use bytes::Bytes;
use rdkv_fabric::clock::unix_now_ms;
use rdkv_proto::wire::{ExpireCondition, Expiry, KeyExpiry, SetCondition, Update, UpdateOutcome};

use super::RespServer;
use super::commands::{self, SetOptions, integer_arg, set_with, updated, upper};
use super::reply::Reply;
use super::store::unexpected;
use crate::order::Finish;

/// A deadline every clock has passed: the key is deleted, as Redis does
/// for an EXPIRE to a time not in the future.
const LONG_AGO_UNIX_MS: u64 = 1;

/// How a time argument counts, or how a TTL is answered: from now or as a
/// unix time, in seconds or milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeForm {
    absolute: bool,
    seconds: bool,
}

impl TimeForm {
    /// SET's and GETEX's options EX, PX, EXAT and PXAT (`option` in upper
    /// case).
    fn of_option(option: &str) -> Option<TimeForm> {
        let (absolute, seconds) = match option {
            "EX" => (false, true),
            "PX" => (false, false),
            "EXAT" => (true, true),
            "PXAT" => (true, false),
            _ => return None,
        };
        Some(TimeForm { absolute, seconds })
    }

    /// The form command `name` (lower case) takes or answers: a `p` prefix
    /// counts milliseconds, an `at` or `time` suffix unix times (EXPIRE,
    /// PEXPIREAT, TTL, PEXPIRETIME, SETEX, PSETEX, ...).
    pub fn of_command(name: &str) -> TimeForm {
        TimeForm {
            absolute: name.ends_with("at") || name.ends_with("time"),
            seconds: !name.starts_with('p'),
        }
    }
}

fn invalid_time(command: &str) -> Reply {
    Reply::err(format!("invalid expire time in '{command}' command"))
}

/// The local wall clock, for Redis's overflow check of a relative time.
fn now_ms() -> i64 {
    i64::try_from(unix_now_ms()).unwrap_or(i64::MAX)
}

/// `n` in `form`'s unit as milliseconds; `None` on overflow.
fn in_ms(n: i64, form: TimeForm) -> Option<i64> {
    if form.seconds {
        n.checked_mul(1000)
    } else {
        Some(n)
    }
}

/// The expire time of SET, SETEX, PSETEX or GETEX (`command`), as Redis's
/// `getExpireMillisecondsOrReply` takes it: a positive integer whose
/// deadline fits in signed milliseconds.
fn positive_time(command: &str, form: TimeForm, arg: &[u8]) -> Result<Expiry, Reply> {
    let n = integer_arg(arg).ok_or_else(Reply::not_integer)?;
    let ms = in_ms(n, form)
        .filter(|ms| *ms > 0)
        .ok_or_else(|| invalid_time(command))?;
    if form.absolute {
        return Ok(Expiry::AtUnixMs(ms.unsigned_abs()));
    }
    if ms.checked_add(now_ms()).is_none() {
        return Err(invalid_time(command));
    }
    Ok(Expiry::AfterMs(ms.unsigned_abs()))
}

/// The time of EXPIRE, PEXPIRE, EXPIREAT or PEXPIREAT (`command`), as
/// Redis's `expireGenericCommand` takes it: any integer whose deadline
/// fits in signed milliseconds; one not in the future deletes the key.
fn expire_time(command: &str, arg: &[u8]) -> Result<Expiry, Reply> {
    let form = TimeForm::of_command(command);
    let n = integer_arg(arg).ok_or_else(Reply::not_integer)?;
    let ms = in_ms(n, form).ok_or_else(|| invalid_time(command))?;
    let base = if form.absolute { 0 } else { now_ms() };
    let at = ms.checked_add(base).ok_or_else(|| invalid_time(command))?;
    Ok(if form.absolute {
        Expiry::AtUnixMs(u64::try_from(at).map_or(LONG_AGO_UNIX_MS, |at| at.max(LONG_AGO_UNIX_MS)))
    } else if ms <= 0 {
        Expiry::AtUnixMs(LONG_AGO_UNIX_MS)
    } else {
        Expiry::AfterMs(ms.unsigned_abs())
    })
}

/// EXPIRE's NX, XX, GT and LT, combined as Redis 7's
/// `parseExtendedExpireArgumentsOrReply` allows.
fn expire_condition(options: &[Bytes]) -> Result<ExpireCondition, Reply> {
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for option in options {
        match upper(option).as_str() {
            "NX" => nx = true,
            "XX" => xx = true,
            "GT" => gt = true,
            "LT" => lt = true,
            _ => {
                let shown = String::from_utf8_lossy(option);
                return Err(Reply::err(format!("Unsupported option {shown}")));
            }
        }
    }
    if nx && (xx || gt || lt) {
        return Err(Reply::err(
            "NX and XX, GT or LT options at the same time are not compatible",
        ));
    }
    if gt && lt {
        return Err(Reply::err(
            "GT and LT options at the same time are not compatible",
        ));
    }
    Ok(match (nx, xx, gt, lt) {
        (true, ..) => ExpireCondition::IfNone,
        // GT already fails on a key without a deadline: XX adds nothing.
        (_, _, true, _) => ExpireCondition::IfLater,
        (_, true, _, true) => ExpireCondition::IfSomeEarlier,
        (_, _, _, true) => ExpireCondition::IfEarlier,
        (_, true, ..) => ExpireCondition::IfSome,
        _ => ExpireCondition::Always,
    })
}

/// EXPIRE, PEXPIRE, EXPIREAT or PEXPIREAT (`command`; `args`: key, time,
/// options): the update of the key. Options are checked before the time,
/// as Redis does.
pub fn expire_update(command: &str, args: &[Bytes]) -> Result<Update, Reply> {
    let condition = expire_condition(&args[2..])?;
    let expiry = expire_time(command, &args[1])?;
    Ok(Update::Expire { expiry, condition })
}

/// PERSIST's update: the EXPIRE of "never".
pub fn persist_update() -> Update {
    Update::Expire {
        expiry: Expiry::Never,
        condition: ExpireCondition::Always,
    }
}

/// The reply of the EXPIRE family and PERSIST.
pub fn expire_reply(outcome: UpdateOutcome) -> Reply {
    match outcome {
        UpdateOutcome::ExpiryChanged { changed, .. } => Reply::Integer(i64::from(changed)),
        other => unexpected(&other),
    }
}

/// The reply of GETEX and GETDEL: the value the key had.
pub fn got_reply(outcome: UpdateOutcome) -> Reply {
    match outcome {
        UpdateOutcome::Got { value, .. } => value.map_or(Reply::Null, Reply::Bulk),
        other => unexpected(&other),
    }
}

/// The reply of TTL, PTTL, EXPIRETIME or PEXPIRETIME (`form`): -2 for an
/// absent key, -1 for one without a deadline; the time left counts from
/// the clock of whoever read the deadline, and seconds are rounded as
/// Redis rounds them.
pub fn ttl_reply(form: TimeForm, expiry: Option<KeyExpiry>) -> Reply {
    let Some(expiry) = expiry else {
        return Reply::Integer(-2);
    };
    let Some(deadline) = expiry.deadline_unix_ms else {
        return Reply::Integer(-1);
    };
    let ms = if form.absolute {
        deadline
    } else {
        deadline.saturating_sub(expiry.now_unix_ms)
    };
    let answer = if form.seconds {
        ms.saturating_add(500) / 1000
    } else {
        ms
    };
    Reply::Integer(i64::try_from(answer).unwrap_or(i64::MAX))
}

/// SETEX or PSETEX (`command`; `args`: key, time, value): a SET with EX or
/// PX.
pub fn setex_options(command: &str, args: &[Bytes]) -> Result<SetOptions, Reply> {
    Ok(SetOptions {
        condition: SetCondition::Always,
        get: false,
        expiry: positive_time(command, TimeForm::of_command(command), &args[1])?,
    })
}

/// The expiry option of SET or GETEX as given, before its time is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExpiryOption<'b> {
    None,
    /// SET's KEEPTTL.
    Keep,
    /// GETEX's PERSIST.
    Persist,
    /// EX, PX, EXAT, PXAT and the time after it.
    Time(TimeForm, &'b Bytes),
}

impl ExpiryOption<'_> {
    /// Whether `next` may follow this option: Redis refuses two different
    /// expiry options, not one repeated (the last time given counts).
    fn admits(&self, next: &ExpiryOption<'_>) -> bool {
        match (self, next) {
            (ExpiryOption::None, _)
            | (ExpiryOption::Keep, ExpiryOption::Keep)
            | (ExpiryOption::Persist, ExpiryOption::Persist) => true,
            (ExpiryOption::Time(given, _), ExpiryOption::Time(form, _)) => given == form,
            _ => false,
        }
    }

    /// The expiry it asks `command` for, its time checked.
    fn expiry(self, command: &str) -> Result<Expiry, Reply> {
        match self {
            ExpiryOption::None | ExpiryOption::Persist => Ok(Expiry::Never),
            ExpiryOption::Keep => Ok(Expiry::Keep),
            ExpiryOption::Time(form, value) => positive_time(command, form, value),
        }
    }
}

/// SET's or GETEX's options, parsed as Redis's
/// `parseExtendedStringArgumentsOrReply` does.
#[derive(Debug)]
struct StringOptions<'b> {
    condition: SetCondition,
    get: bool,
    expiry: ExpiryOption<'b>,
}

/// Parses SET's options (`set`) or GETEX's; anything else, a missing time
/// or a conflicting pair is a syntax error.
fn string_options(options: &[Bytes], set: bool) -> Result<StringOptions<'_>, Reply> {
    let mut parsed = StringOptions {
        condition: SetCondition::Always,
        get: false,
        expiry: ExpiryOption::None,
    };
    let mut rest = options;
    while let Some((option, tail)) = rest.split_first() {
        rest = tail;
        let word = upper(option);
        let expiry = match word.as_str() {
            "NX" if set && parsed.condition != SetCondition::IfPresent => {
                parsed.condition = SetCondition::IfAbsent;
                continue;
            }
            "XX" if set && parsed.condition != SetCondition::IfAbsent => {
                parsed.condition = SetCondition::IfPresent;
                continue;
            }
            "GET" if set => {
                parsed.get = true;
                continue;
            }
            "KEEPTTL" if set => ExpiryOption::Keep,
            "PERSIST" if !set => ExpiryOption::Persist,
            other => match (TimeForm::of_option(other), tail.split_first()) {
                (Some(form), Some((value, after))) => {
                    rest = after;
                    ExpiryOption::Time(form, value)
                }
                _ => return Err(Reply::syntax()),
            },
        };
        if !parsed.expiry.admits(&expiry) {
            return Err(Reply::syntax());
        }
        parsed.expiry = expiry;
    }
    Ok(parsed)
}

/// SET key value [NX|XX] [GET] [EX s|PX ms|EXAT unix-s|PXAT unix-ms|KEEPTTL]
/// (`options`: what follows the value).
pub fn set_options(options: &[Bytes]) -> Result<SetOptions, Reply> {
    let parsed = string_options(options, true)?;
    Ok(SetOptions {
        condition: parsed.condition,
        get: parsed.get,
        expiry: parsed.expiry.expiry("set")?,
    })
}

/// What a GETEX does.
#[derive(Debug)]
pub enum GetEx {
    /// No option: a plain GET.
    Read,
    /// The value, and the key's deadline changed.
    Update(Update),
    /// A time Redis refuses, but only once it has found the key: a null
    /// reply for an absent key, this error for a present one.
    RefusedIfFound(Reply),
}

/// GETEX key [EX s|PX ms|EXAT unix-s|PXAT unix-ms|PERSIST].
pub fn getex_plan(args: &[Bytes]) -> Result<GetEx, Reply> {
    let parsed = string_options(&args[1..], false)?;
    if parsed.expiry == ExpiryOption::None {
        return Ok(GetEx::Read);
    }
    Ok(match parsed.expiry.expiry("getex") {
        Ok(expiry) => GetEx::Update(Update::GetEx { expiry }),
        Err(refused) => GetEx::RefusedIfFound(refused),
    })
}

/// GETEX's reply when its time was refused: `value` is the key's.
pub fn refused_if_found(refused: Reply, value: Option<&Bytes>) -> Reply {
    value.map_or(Reply::Null, |_| refused)
}

async fn setex_command(
    server: &RespServer,
    command: &str,
    args: &[Bytes],
    place: Option<Finish>,
) -> Reply {
    match setex_options(command, args) {
        Ok(options) => set_with(server, &args[0], &args[2], options, place).await,
        Err(refused) => refused,
    }
}

pub async fn setex(server: &RespServer, args: &[Bytes], place: Option<Finish>) -> Reply {
    setex_command(server, "setex", args, place).await
}

pub async fn psetex(server: &RespServer, args: &[Bytes], place: Option<Finish>) -> Reply {
    setex_command(server, "psetex", args, place).await
}

async fn expire_command(
    server: &RespServer,
    command: &str,
    args: &[Bytes],
    place: Option<Finish>,
) -> Reply {
    let update = expire_update(command, args);
    updated(server, &args[0], update, expire_reply, place).await
}

pub async fn expire(server: &RespServer, args: &[Bytes], place: Option<Finish>) -> Reply {
    expire_command(server, "expire", args, place).await
}

pub async fn pexpire(server: &RespServer, args: &[Bytes], place: Option<Finish>) -> Reply {
    expire_command(server, "pexpire", args, place).await
}

pub async fn expireat(server: &RespServer, args: &[Bytes], place: Option<Finish>) -> Reply {
    expire_command(server, "expireat", args, place).await
}

pub async fn pexpireat(server: &RespServer, args: &[Bytes], place: Option<Finish>) -> Reply {
    expire_command(server, "pexpireat", args, place).await
}

pub async fn persist(server: &RespServer, args: &[Bytes], place: Option<Finish>) -> Reply {
    updated(server, &args[0], Ok(persist_update()), expire_reply, place).await
}

async fn ttl_command(server: &RespServer, command: &str, args: &[Bytes]) -> Reply {
    match server.ttl(&args[0]).await {
        Ok(expiry) => ttl_reply(TimeForm::of_command(command), expiry),
        Err(e) => e,
    }
}

pub async fn ttl(server: &RespServer, args: &[Bytes]) -> Reply {
    ttl_command(server, "ttl", args).await
}

pub async fn pttl(server: &RespServer, args: &[Bytes]) -> Reply {
    ttl_command(server, "pttl", args).await
}

pub async fn expiretime(server: &RespServer, args: &[Bytes]) -> Reply {
    ttl_command(server, "expiretime", args).await
}

pub async fn pexpiretime(server: &RespServer, args: &[Bytes]) -> Reply {
    ttl_command(server, "pexpiretime", args).await
}

pub async fn getex(server: &RespServer, args: &[Bytes]) -> Reply {
    let plan = match getex_plan(args) {
        Ok(plan) => plan,
        Err(refused) => return refused,
    };
    match plan {
        GetEx::Read => commands::get(server, args).await,
        GetEx::Update(update) => updated(server, &args[0], Ok(update), got_reply, None).await,
        GetEx::RefusedIfFound(refused) => match server.get(&args[0]).await {
            Ok(value) => refused_if_found(refused, value.as_ref()),
            Err(e) => e,
        },
    }
}

pub async fn getdel(server: &RespServer, args: &[Bytes], place: Option<Finish>) -> Reply {
    updated(server, &args[0], Ok(Update::GetDel), got_reply, place).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&'static str]) -> Vec<Bytes> {
        words
            .iter()
            .map(|w| Bytes::from_static(w.as_bytes()))
            .collect()
    }

    fn error(result: Result<impl std::fmt::Debug, Reply>) -> String {
        match result {
            Err(Reply::Error(text)) => text,
            other => panic!("not an error: {other:?}"),
        }
    }

    #[test]
    fn command_names_give_their_time_form() {
        let form = |name| {
            let f = TimeForm::of_command(name);
            (f.absolute, f.seconds)
        };
        assert_eq!(form("expire"), (false, true));
        assert_eq!(form("pexpire"), (false, false));
        assert_eq!(form("expireat"), (true, true));
        assert_eq!(form("pexpireat"), (true, false));
        assert_eq!(form("ttl"), (false, true));
        assert_eq!(form("pttl"), (false, false));
        assert_eq!(form("expiretime"), (true, true));
        assert_eq!(form("pexpiretime"), (true, false));
        assert_eq!(form("setex"), (false, true));
        assert_eq!(form("psetex"), (false, false));
    }

    #[test]
    fn set_takes_every_redis_7_option() {
        let set = |words| set_options(&args(words));
        let options = set(&["NX", "GET", "EX", "10"]).expect("valid");
        assert_eq!(options.condition, SetCondition::IfAbsent);
        assert!(options.get);
        assert_eq!(options.expiry, Expiry::AfterMs(10_000));
        let options = set(&["px", "5", "XX"]).expect("valid");
        assert_eq!(options.expiry, Expiry::AfterMs(5));
        assert_eq!(
            set(&["EXAT", "20"]).map(|o| o.expiry),
            Ok(Expiry::AtUnixMs(20_000))
        );
        assert_eq!(
            set(&["PXAT", "20"]).map(|o| o.expiry),
            Ok(Expiry::AtUnixMs(20))
        );
        assert_eq!(set(&["KEEPTTL"]).map(|o| o.expiry), Ok(Expiry::Keep));
        assert_eq!(set(&[]).map(|o| o.expiry), Ok(Expiry::Never));
        // Repeats are accepted as Redis accepts them; the last time counts.
        assert_eq!(
            set(&["EX", "1", "EX", "2", "NX", "NX"]).map(|o| o.expiry),
            Ok(Expiry::AfterMs(2_000))
        );
    }

    #[test]
    fn set_refuses_what_redis_refuses_with_its_words() {
        let set = |words| error(set_options(&args(words)));
        for bad in [
            &["NX", "XX"][..],
            &["EX", "1", "PX", "1"],
            &["EX", "1", "KEEPTTL"],
            &["KEEPTTL", "PXAT", "1"],
            &["EX"],
            &["PERSIST"],
            &["EXPIRE", "1"],
        ] {
            assert_eq!(set(bad), "ERR syntax error", "{bad:?}");
        }
        for bad in [
            &["EX", "0"][..],
            &["PX", "-1"],
            &["EXAT", "0"],
            &["EX", "9223372036854776"],
            &["PX", "9223372036854775807"],
        ] {
            assert_eq!(
                set(bad),
                "ERR invalid expire time in 'set' command",
                "{bad:?}"
            );
        }
        assert_eq!(
            set(&["EX", "ten"]),
            "ERR value is not an integer or out of range"
        );
        // A syntax error is found before a bad time.
        assert_eq!(set(&["EX", "0", "XY"]), "ERR syntax error");
    }

    #[test]
    fn setex_checks_its_time_under_its_own_name() {
        let setex = |name, time| error(setex_options(name, &args(&["k", time, "v"])));
        assert_eq!(
            setex("setex", "0"),
            "ERR invalid expire time in 'setex' command"
        );
        assert_eq!(
            setex("psetex", "-5"),
            "ERR invalid expire time in 'psetex' command"
        );
        assert_eq!(
            setex_options("psetex", &args(&["k", "250", "v"])).map(|o| o.expiry),
            Ok(Expiry::AfterMs(250))
        );
    }

    fn expire(command: &str, words: &[&'static str]) -> Result<Update, Reply> {
        expire_update(command, &args(words))
    }

    fn expire_of(expiry: Expiry, condition: ExpireCondition) -> Result<Update, Reply> {
        Ok(Update::Expire { expiry, condition })
    }

    #[test]
    fn expire_times_become_deadlines_or_deletes() {
        use ExpireCondition::Always;
        let past = Expiry::AtUnixMs(LONG_AGO_UNIX_MS);
        assert_eq!(
            expire("expire", &["k", "10"]),
            expire_of(Expiry::AfterMs(10_000), Always)
        );
        assert_eq!(expire("expire", &["k", "0"]), expire_of(past, Always));
        assert_eq!(expire("pexpire", &["k", "-5"]), expire_of(past, Always));
        assert_eq!(expire("expireat", &["k", "-5"]), expire_of(past, Always));
        assert_eq!(
            expire("pexpireat", &["k", "1234"]),
            expire_of(Expiry::AtUnixMs(1234), Always)
        );
        assert_eq!(
            error(expire("expire", &["k", "9223372036854776"])),
            "ERR invalid expire time in 'expire' command"
        );
        assert_eq!(
            error(expire("pexpire", &["k", "9223372036854775807"])),
            "ERR invalid expire time in 'pexpire' command"
        );
        assert_eq!(
            error(expire("expireat", &["k", "-9223372036854776"])),
            "ERR invalid expire time in 'expireat' command"
        );
        assert_eq!(
            error(expire("expire", &["k", "soon"])),
            "ERR value is not an integer or out of range"
        );
    }

    #[test]
    fn expire_options_combine_as_in_redis_7() {
        use ExpireCondition::*;
        let with = |options: &[&'static str]| {
            let mut words = vec!["k", "10"];
            words.extend_from_slice(options);
            expire("expire", &words)
        };
        let after = Expiry::AfterMs(10_000);
        assert_eq!(with(&["nx"]), expire_of(after, IfNone));
        assert_eq!(with(&["XX"]), expire_of(after, IfSome));
        assert_eq!(with(&["GT"]), expire_of(after, IfLater));
        assert_eq!(with(&["LT"]), expire_of(after, IfEarlier));
        assert_eq!(with(&["XX", "GT"]), expire_of(after, IfLater));
        assert_eq!(with(&["LT", "XX"]), expire_of(after, IfSomeEarlier));
        assert_eq!(with(&["NX", "NX"]), expire_of(after, IfNone));
        let nx = "ERR NX and XX, GT or LT options at the same time are not compatible";
        for bad in [&["NX", "XX"][..], &["NX", "GT"], &["LT", "NX"]] {
            assert_eq!(error(with(bad)), nx, "{bad:?}");
        }
        assert_eq!(
            error(with(&["GT", "LT"])),
            "ERR GT and LT options at the same time are not compatible"
        );
        assert_eq!(error(with(&["ZZ"])), "ERR Unsupported option ZZ");
        // Options are checked before the time.
        assert_eq!(
            error(expire("expire", &["k", "x", "ZZ"])),
            "ERR Unsupported option ZZ"
        );
    }

    fn at(deadline: Option<u64>, now: u64) -> Option<KeyExpiry> {
        Some(KeyExpiry {
            version: 1,
            deadline_unix_ms: deadline,
            now_unix_ms: now,
        })
    }

    #[test]
    fn ttls_are_answered_and_rounded_as_redis_does() {
        let reply = |command, expiry| ttl_reply(TimeForm::of_command(command), expiry);
        assert_eq!(reply("ttl", None), Reply::Integer(-2));
        assert_eq!(reply("pexpiretime", at(None, 5)), Reply::Integer(-1));
        assert_eq!(reply("ttl", at(Some(10_499), 0)), Reply::Integer(10));
        assert_eq!(reply("ttl", at(Some(10_500), 0)), Reply::Integer(11));
        assert_eq!(reply("pttl", at(Some(10_500), 500)), Reply::Integer(10_000));
        assert_eq!(reply("pttl", at(Some(100), 500)), Reply::Integer(0));
        assert_eq!(reply("expiretime", at(Some(7_600), 1)), Reply::Integer(8));
        assert_eq!(
            reply("pexpiretime", at(Some(7_600), 1)),
            Reply::Integer(7_600)
        );
    }

    #[test]
    fn getex_reads_updates_or_refuses_only_a_present_key() {
        let plan = |words| getex_plan(&args(words));
        assert!(matches!(plan(&["k"]), Ok(GetEx::Read)));
        assert!(matches!(
            plan(&["k", "PERSIST"]),
            Ok(GetEx::Update(Update::GetEx {
                expiry: Expiry::Never
            }))
        ));
        assert!(matches!(
            plan(&["k", "EXAT", "33"]),
            Ok(GetEx::Update(Update::GetEx {
                expiry: Expiry::AtUnixMs(33_000)
            }))
        ));
        for bad in [
            &["k", "KEEPTTL"][..],
            &["k", "NX"],
            &["k", "EX", "1", "PERSIST"],
        ] {
            assert_eq!(error(plan(bad)), "ERR syntax error", "{bad:?}");
        }
        let Ok(GetEx::RefusedIfFound(refused)) = plan(&["k", "PX", "0"]) else {
            panic!("PX 0 is refused once the key is found");
        };
        assert_eq!(refused_if_found(refused.clone(), None), Reply::Null);
        assert_eq!(
            refused_if_found(refused, Some(&Bytes::from("v"))),
            Reply::err("invalid expire time in 'getex' command")
        );
    }
}
