//! openraft's storage traits on `LogStore`.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};

use openraft::OptionalSend;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};

use super::store::LogStore;
use crate::raft::{Entry, LogId, TypeConfig, Vote};

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => match s.checked_add(1) {
                Some(s) => s,
                None => return Ok(Vec::new()),
            },
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => u64::MAX,
        };
        Ok(self.shared.read(start, end)?)
    }

    /// The vote validated at `open` and replaced by every `save_vote`
    /// (replication calls this twice per batch, so it never reads the disk).
    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(self.shared.vote()?)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let (last_purged_log_id, last_log_id) = self.shared.log_state()?;
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let vote = *vote;
        self.blocking(move |s| s.save_vote(&vote)).await
    }

    /// Inline, not on the blocking pool: it is one small `pwrite` of the
    /// advisory committed index (no fsync), and it lies on every write's
    /// path between commit and apply, where a thread hand-off cost more
    /// than the write.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        Ok(self.shared.save_committed(committed)?)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self.shared.committed()?)
    }

    /// Writes the records (readable on return) and queues `callback` for the
    /// flusher's next group fsync.
    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        Ok(self.shared.append(entries, callback)?)
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        self.blocking(move |s| s.truncate_after(last_log_id)).await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        self.blocking(move |s| s.purge(log_id)).await
    }
}
