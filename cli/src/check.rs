//! `rdkvctl check`: whether every member holds the same state, as etcd's
//! `endpoint hashkv` tells. Each member keeps its state digest at each of
//! its last applied indexes; members are compared at the newest index they
//! all passed, so a busy cluster can be checked without stopping writes.

use rdkv_client::StateDigestAt;

use crate::output::{Json, Table, View, lines};

/// One member's part of the check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckRow {
    pub endpoint: String,
    /// The member's newest applied index.
    pub applied_index: u64,
    /// Its digest at the common index (`None`: no common index).
    pub digest: Option<u64>,
}

/// The check's result: the index compared at and each member's digest there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckView {
    pub common_index: Option<u64>,
    pub rows: Vec<CheckRow>,
}

impl CheckView {
    /// Compares the members' digest histories (oldest first) at the newest
    /// index all of them hold.
    pub fn compare(histories: Vec<(String, Vec<StateDigestAt>)>) -> CheckView {
        // An index every member holds is at or below every member's newest.
        let held_by_all = |index: u64| {
            histories
                .iter()
                .all(|(_, h)| h.iter().any(|d| d.applied_index == index))
        };
        let common_index = histories.first().and_then(|(_, first)| {
            first
                .iter()
                .map(|d| d.applied_index)
                .filter(|index| held_by_all(*index))
                .max()
        });
        let rows = histories
            .into_iter()
            .map(|(endpoint, history)| CheckRow {
                endpoint,
                applied_index: history.iter().map(|d| d.applied_index).max().unwrap_or(0),
                digest: common_index.and_then(|index| {
                    history
                        .iter()
                        .find(|d| d.applied_index == index)
                        .map(|d| d.digest)
                }),
            })
            .collect();
        CheckView { common_index, rows }
    }

    /// Whether every member has the same digest at the common index.
    pub fn agrees(&self) -> bool {
        self.common_index.is_some()
            && self
                .rows
                .windows(2)
                .all(|pair| pair[0].digest == pair[1].digest)
    }

    fn verdict(&self) -> String {
        match (self.common_index, self.agrees()) {
            (None, _) => "no applied index is held by every member: retry".to_owned(),
            (Some(index), true) => format!("every member has the same state at index {index}"),
            (Some(index), false) => format!("MEMBERS DIFFER at index {index}"),
        }
    }
}

fn hex(digest: Option<u64>) -> String {
    digest.map_or_else(|| "-".to_owned(), |d| format!("{d:016x}"))
}

impl View for CheckView {
    fn simple(&self) -> String {
        let rows = self.rows.iter().map(|r| {
            format!(
                "{}: digest {} (applied {})",
                r.endpoint,
                hex(r.digest),
                r.applied_index
            )
        });
        lines(rows.chain([self.verdict()]))
    }

    fn table(&self) -> String {
        let table = Table::of(
            ["ENDPOINT", "APPLIED INDEX", "DIGEST AT COMMON INDEX"],
            self.rows.iter().map(|r| {
                [
                    r.endpoint.clone(),
                    r.applied_index.to_string(),
                    hex(r.digest),
                ]
            }),
        );
        format!("{table}\n{}", self.verdict())
    }

    fn json(&self) -> Json {
        Json::obj([
            (
                "common_index",
                self.common_index.map_or(Json::Null, Json::U64),
            ),
            ("agree", Json::Bool(self.agrees())),
            (
                "members",
                Json::Arr(self.rows.iter().map(CheckRow::json).collect()),
            ),
        ])
    }
}

impl CheckRow {
    fn json(&self) -> Json {
        Json::obj([
            ("endpoint", Json::str(&self.endpoint)),
            ("applied_index", Json::U64(self.applied_index)),
            ("digest", self.digest.map_or(Json::Null, Json::U64)),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history(
        range: std::ops::RangeInclusive<u64>,
        digest: impl Fn(u64) -> u64,
    ) -> Vec<StateDigestAt> {
        range
            .map(|applied_index| StateDigestAt {
                applied_index,
                digest: digest(applied_index),
            })
            .collect()
    }

    #[test]
    fn members_are_compared_at_the_newest_index_they_all_hold() {
        let view = CheckView::compare(vec![
            ("a".into(), history(1..=10, |i| i * 7)),
            ("b".into(), history(4..=8, |i| i * 7)),
            ("c".into(), history(6..=12, |i| i * 7)),
        ]);
        assert_eq!(view.common_index, Some(8));
        assert!(view.agrees());
        assert_eq!(view.rows[2].applied_index, 12);
        assert_eq!(view.rows[1].digest, Some(56));
    }

    #[test]
    fn a_different_digest_at_the_common_index_is_a_disagreement() {
        let view = CheckView::compare(vec![
            ("a".into(), history(1..=5, |i| i)),
            ("b".into(), history(1..=5, |i| if i >= 5 { 99 } else { i })),
        ]);
        assert_eq!(view.common_index, Some(5));
        assert!(!view.agrees());
        assert!(view.simple().contains("MEMBERS DIFFER at index 5"));
    }

    #[test]
    fn without_a_common_index_there_is_no_verdict_of_agreement() {
        let view = CheckView::compare(vec![
            ("a".into(), history(1..=3, |i| i)),
            ("b".into(), history(7..=9, |i| i)),
        ]);
        assert_eq!(view.common_index, None);
        assert!(!view.agrees());
        let empty = CheckView::compare(vec![("a".into(), Vec::new())]);
        assert_eq!(empty.common_index, None);
    }
}
