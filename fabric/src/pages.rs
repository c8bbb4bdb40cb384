//! Which pages region memory sits on. A GET whose neighbourhood and block
//! miss the caches also misses the TLB on 4 KiB pages: two page walks, one
//! after the other, since the block's place is in the neighbourhood. On
//! 2 MiB pages a 256 MiB region needs 128 TLB entries and the walks go.
//! Every region mapping asks for transparent huge pages (`MADV_HUGEPAGE`,
//! in [`crate::memory`]); whether a shared (memfd) region gets them is the
//! operator's choice, `/sys/kernel/mm/transparent_hugepage/shmem_enabled`
//! (Debian's default, `never`, keeps 4 KiB pages). This module reads that
//! setting and what a process got.

use std::io;

/// The kernel's setting of transparent huge pages for shared memory.
pub const SHMEM_SETTING_PATH: &str = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";

/// The kernel's setting of transparent huge pages for anonymous memory.
pub const ANON_SETTING_PATH: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// What a transparent-huge-page setting does to a mapping that asked for
/// huge pages (`MADV_HUGEPAGE`): the selected word of the sysfs file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThpSetting(pub String);

impl ThpSetting {
    /// The selected word of a sysfs setting file, `always [madvise] never`
    /// -> `madvise`; `None` when no word is bracketed.
    pub fn parse(text: &str) -> Option<ThpSetting> {
        let start = text.find('[')? + 1;
        let len = text[start..].find(']')?;
        Some(ThpSetting(text[start..start + len].to_owned()))
    }

    /// Reads a setting file ([`SHMEM_SETTING_PATH`], [`ANON_SETTING_PATH`]).
    pub fn read(path: &str) -> io::Result<ThpSetting> {
        let text = std::fs::read_to_string(path)?;
        ThpSetting::parse(&text).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{path}: no selected setting in {text:?}"),
            )
        })
    }

    /// Whether a mapping that asked for huge pages gets them: every
    /// setting but `never` and `deny` (the shmem file's `within_size`
    /// does for a region, whose size is fixed at creation).
    pub fn gives_advised_mappings(&self) -> bool {
        !matches!(self.0.as_str(), "never" | "deny")
    }
}

/// Bytes of this process's mappings on 2 MiB pages, from
/// `/proc/self/smaps_rollup`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HugeMapped {
    /// Shared memory (memfd regions): `ShmemPmdMapped`.
    pub shmem_bytes: u64,
    /// Anonymous memory: `AnonHugePages`.
    pub anon_bytes: u64,
}

impl HugeMapped {
    /// Parses the text of a `smaps_rollup` (fields in kB); a field missing
    /// (an older kernel) counts as none.
    pub fn parse(text: &str) -> HugeMapped {
        let field_bytes = |name: &str| -> u64 {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
                .map_or(0, |kib| kib.saturating_mul(1024))
        };
        HugeMapped {
            shmem_bytes: field_bytes("ShmemPmdMapped"),
            anon_bytes: field_bytes("AnonHugePages"),
        }
    }

    /// This process's figures now.
    pub fn of_this_process() -> io::Result<HugeMapped> {
        Ok(HugeMapped::parse(&std::fs::read_to_string(
            "/proc/self/smaps_rollup",
        )?))
    }
}

/// Bytes on 2 MiB pages of the mapping that starts at `start`, from the
/// text of a `/proc/<pid>/smaps` (`ShmemPmdMapped`, `FilePmdMapped` and
/// `AnonHugePages` of its entry, in kB); `None` if no mapping starts there.
pub fn huge_bytes_of_mapping(smaps: &str, start: usize) -> Option<u64> {
    let mut lines = smaps.lines();
    lines.find(|line| mapping_start(line) == Some(start))?;
    let huge_kib: u64 = lines
        .take_while(|line| mapping_start(line).is_none())
        .filter_map(|line| {
            let (name, rest) = line.split_once(':')?;
            matches!(name, "ShmemPmdMapped" | "FilePmdMapped" | "AnonHugePages")
                .then(|| rest.split_whitespace().next()?.parse::<u64>().ok())?
        })
        .sum();
    Some(huge_kib.saturating_mul(1024))
}

/// The start address of an smaps entry's first line (`start-end perms ...`);
/// `None` for a field line (`Name: value kB`).
fn mapping_start(line: &str) -> Option<usize> {
    let (start, _) = line.split_whitespace().next()?.split_once('-')?;
    usize::from_str_radix(start, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bracketed_word_is_the_setting() {
        let shmem = ThpSetting::parse("always within_size [advise] never deny force\n").unwrap();
        assert_eq!(shmem, ThpSetting("advise".into()));
        assert!(shmem.gives_advised_mappings());
        let off = ThpSetting::parse("always within_size advise [never] deny force\n").unwrap();
        assert!(!off.gives_advised_mappings());
        assert!(!ThpSetting("deny".into()).gives_advised_mappings());
        assert!(ThpSetting("within_size".into()).gives_advised_mappings());
        assert_eq!(ThpSetting::parse("always madvise never"), None);
        assert_eq!(ThpSetting::parse("[never"), None);
    }

    #[test]
    fn smaps_rollup_fields_are_read_in_bytes() {
        let text = "55d0c0000000-7ffd00000000 ---p 00000000 00:00 0    [rollup]\n\
                    Rss:              473196 kB\n\
                    AnonHugePages:      4096 kB\n\
                    ShmemPmdMapped:   202752 kB\n\
                    FilePmdMapped:         0 kB\n";
        assert_eq!(
            HugeMapped::parse(text),
            HugeMapped {
                shmem_bytes: 202_752 * 1024,
                anon_bytes: 4096 * 1024
            }
        );
        assert_eq!(HugeMapped::parse("Rss: 1 kB\n"), HugeMapped::default());
    }

    #[test]
    fn a_mappings_huge_bytes_are_its_own_entrys() {
        let smaps = "7f0000000000-7f0010000000 rw-s 00000000 00:01 5 /memfd:rdkv-region (deleted)\n\
                     Size:             262144 kB\n\
                     ShmemPmdMapped:   100352 kB\n\
                     FilePmdMapped:         0 kB\n\
                     VmFlags: rd wr sh mr mw me ms sd hg\n\
                     7f0010000000-7f0010200000 rw-p 00000000 00:00 0\n\
                     AnonHugePages:      2048 kB\n";
        assert_eq!(
            huge_bytes_of_mapping(smaps, 0x7f00_0000_0000),
            Some(100_352 * 1024)
        );
        assert_eq!(
            huge_bytes_of_mapping(smaps, 0x7f00_1000_0000),
            Some(2048 * 1024)
        );
        assert_eq!(huge_bytes_of_mapping(smaps, 0x7f00_0000_1000), None);
    }
}
