//! Which pages region memory sits on. A GET whose neighbourhood and block
//! miss the caches also misses the TLB on 4 KiB pages: two page walks, one
//! after the other, since the block's place is in the neighbourhood. On
//! 2 MiB pages a 256 MiB region needs 128 TLB entries and the walks go.
//! Every region mapping asks for transparent huge pages (`MADV_HUGEPAGE`,
//! in [`crate::memory`]); whether a shared (memfd) region gets them is the
//! operator's choice, `/sys/kernel/mm/transparent_hugepage/shmem_enabled`
//! (the kernel's default, `never`, keeps 4 KiB pages). This module reads
//! that setting and what a mapping asked for and got.

use std::io;

/// The kernel's setting of transparent huge pages for shared memory (a
/// memfd's pages: only this top-level file counts for them).
pub const SHMEM_SETTING_PATH: &str = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";

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

    /// The setting for shared memory ([`SHMEM_SETTING_PATH`]): the one that
    /// decides a region's pages.
    pub fn shmem() -> io::Result<ThpSetting> {
        let text = std::fs::read_to_string(SHMEM_SETTING_PATH)?;
        ThpSetting::parse(&text).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{SHMEM_SETTING_PATH}: no selected setting in {text:?}"),
            )
        })
    }

    /// Whether a mapping that asked for huge pages may get them (the
    /// kernel still falls back to 4 KiB pages when it finds no free 2 MiB
    /// one): every setting but `never` and `deny` (`within_size` does for
    /// a region, whose size is fixed before it is mapped).
    pub fn allows_advised_mappings(&self) -> bool {
        !matches!(self.0.as_str(), "never" | "deny")
    }
}

/// What one mapping asked for and got, from its `/proc/self/smaps` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MappingPages {
    pub len_bytes: u64,
    /// Bytes on 2 MiB pages now (`ShmemPmdMapped` + `AnonHugePages`; a
    /// mapping is one or the other).
    pub huge_bytes: u64,
    /// It asked for huge pages (`MADV_HUGEPAGE`: `hg` in `VmFlags`).
    pub asked_for_huge: bool,
}

impl MappingPages {
    /// The entry of the mapping that holds `address` in the text of a
    /// `/proc/<pid>/smaps`; `None` if no mapping holds it. A mapping that
    /// the kernel merged with a neighbour of the same flags is reported
    /// whole.
    pub fn parse(smaps: &str, address: usize) -> Option<MappingPages> {
        smaps_entries(smaps)
            .find(|entry| (entry.start..entry.end).contains(&address))
            .map(|entry| entry.pages)
    }

    /// The mapping of this process that holds `address`, now.
    pub fn of_this_process(address: usize) -> io::Result<MappingPages> {
        let smaps = std::fs::read_to_string("/proc/self/smaps")?;
        MappingPages::parse(&smaps, address).ok_or_else(|| {
            io::Error::other(format!("no mapping holds {address:#x} in /proc/self/smaps"))
        })
    }
}

/// One mapping's entry of a `/proc/<pid>/smaps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmapsEntry<'a> {
    pub start: usize,
    pub end: usize,
    /// What it maps: a file's path, `/memfd:NAME (deleted)` for a memfd,
    /// `[heap]` or `[stack]`, or empty for anonymous memory.
    pub path: &'a str,
    pub pages: MappingPages,
}

/// Every mapping's entry of the text of a `/proc/<pid>/smaps`, in address
/// order. A field that does not parse counts as absent (0 bytes on 2 MiB
/// pages).
pub fn smaps_entries(smaps: &str) -> impl Iterator<Item = SmapsEntry<'_>> {
    let mut lines = smaps.lines().peekable();
    std::iter::from_fn(move || {
        let (start, end, path) = loop {
            let line = lines.next()?;
            if let Some((start, end)) = mapping_range(line) {
                break (start, end, mapping_path(line));
            }
        };
        let mut pages = MappingPages {
            len_bytes: (end - start) as u64,
            huge_bytes: 0,
            asked_for_huge: false,
        };
        while let Some(line) = lines.next_if(|line| mapping_range(line).is_none()) {
            add_field(&mut pages, line);
        }
        Some(SmapsEntry {
            start,
            end,
            path,
            pages,
        })
    })
}

/// What one field line of an smaps entry says of its pages, if anything.
fn add_field(pages: &mut MappingPages, line: &str) {
    let Some((name, rest)) = line.split_once(':') else {
        return;
    };
    match name {
        "ShmemPmdMapped" | "AnonHugePages" => {
            pages.huge_bytes += field_bytes(rest).unwrap_or(0);
        }
        "VmFlags" => pages.asked_for_huge = rest.split_whitespace().any(|f| f == "hg"),
        _ => {}
    }
}

/// Bytes of shared memory this process maps on 2 MiB pages
/// (`ShmemPmdMapped` of `/proc/self/smaps_rollup`); `None` when the kernel
/// does not report it.
pub fn shmem_huge_bytes(smaps_rollup: &str) -> Option<u64> {
    smaps_rollup
        .lines()
        .find_map(|line| line.strip_prefix("ShmemPmdMapped:"))
        .and_then(field_bytes)
}

/// The bytes of a size field's value (`   2048 kB`); `None` when it does
/// not parse.
fn field_bytes(value: &str) -> Option<u64> {
    let kib = value.split_whitespace().next()?.parse::<u64>().ok()?;
    Some(kib.saturating_mul(1024))
}

/// The path of an smaps entry's first line: what follows its five fields
/// (`start-end perms offset dev inode`), which may hold spaces.
fn mapping_path(line: &str) -> &str {
    let mut rest = line.trim_start();
    for _ in 0..5 {
        rest = rest
            .split_once(char::is_whitespace)
            .map_or("", |(_, after)| after.trim_start());
    }
    rest.trim_end()
}

/// The address range of an smaps entry's first line (`start-end perms
/// ...`); `None` for a field line (`Name: value kB`, whose first word has
/// no `-`), and for a range that ends before it starts.
fn mapping_range(line: &str) -> Option<(usize, usize)> {
    let (start, end) = line.split_whitespace().next()?.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    (start <= end).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bracketed_word_is_the_setting() {
        let shmem = ThpSetting::parse("always within_size [advise] never deny force\n").unwrap();
        assert_eq!(shmem, ThpSetting("advise".into()));
        assert!(shmem.allows_advised_mappings());
        let off = ThpSetting::parse("always within_size advise [never] deny force\n").unwrap();
        assert!(!off.allows_advised_mappings());
        assert!(!ThpSetting("deny".into()).allows_advised_mappings());
        assert!(ThpSetting("within_size".into()).allows_advised_mappings());
        assert_eq!(ThpSetting::parse("always madvise never"), None);
        assert_eq!(ThpSetting::parse("[never"), None);
    }

    const SMAPS: &str = "7f0000000000-7f0010000000 rw-s 00000000 00:01 5 /memfd:rdkv-region (deleted)\n\
                         Size:             262144 kB\n\
                         ShmemPmdMapped:   100352 kB\n\
                         FilePmdMapped:         0 kB\n\
                         THPeligible:           1\n\
                         VmFlags: rd wr sh mr mw me ms sd hg\n\
                         7f0010000000-7f0010200000 rw-p 00000000 00:00 0\n\
                         AnonHugePages:      2048 kB\n\
                         VmFlags: rd wr mr mw me ac sd\n";

    #[test]
    fn a_mappings_pages_are_its_own_entrys() {
        let region = MappingPages {
            len_bytes: 256 << 20,
            huge_bytes: 100_352 * 1024,
            asked_for_huge: true,
        };
        assert_eq!(MappingPages::parse(SMAPS, 0x7f00_0000_0000), Some(region));
        // Any address inside the mapping finds it.
        assert_eq!(MappingPages::parse(SMAPS, 0x7f00_0fff_ffff), Some(region));
        assert_eq!(
            MappingPages::parse(SMAPS, 0x7f00_1000_0000),
            Some(MappingPages {
                len_bytes: 2 << 20,
                huge_bytes: 2048 * 1024,
                asked_for_huge: false,
            })
        );
        assert_eq!(MappingPages::parse(SMAPS, 0x7f00_1020_0000), None);
    }

    #[test]
    fn every_entry_has_its_path_and_pages() {
        let entries: Vec<_> = smaps_entries(SMAPS).collect();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].path, "/memfd:rdkv-region (deleted)");
        assert_eq!(
            (entries[0].start, entries[0].end),
            (0x7f00_0000_0000, 0x7f00_1000_0000)
        );
        assert!(entries[0].pages.asked_for_huge);
        assert_eq!(entries[1].path, "");
        assert_eq!(entries[1].pages.huge_bytes, 2048 * 1024);
        assert!(!entries[1].pages.asked_for_huge);
        // A field that does not parse counts as absent; the entry is kept.
        let odd = "7f0000000000-7f0000001000 rw-p 00000000 00:00 0 [heap]\n\
                   AnonHugePages: many kB\n\
                   VmFlags: rd wr hg\n";
        let odd: Vec<_> = smaps_entries(odd).collect();
        assert_eq!(odd.len(), 1);
        assert_eq!(odd[0].path, "[heap]");
        assert_eq!(odd[0].pages.huge_bytes, 0);
        assert!(odd[0].pages.asked_for_huge);
        assert_eq!(smaps_entries("").count(), 0);
        // A range that ends before it starts is no entry (and no panic).
        assert_eq!(
            smaps_entries("2000-1000 rw-p 00000000 00:00 0\n").count(),
            0
        );
    }

    #[test]
    fn smaps_rollup_reports_shared_memory_on_huge_pages() {
        let text = "55d0c0000000-7ffd00000000 ---p 00000000 00:00 0    [rollup]\n\
                    Rss:              473196 kB\n\
                    AnonHugePages:      4096 kB\n\
                    ShmemPmdMapped:   202752 kB\n";
        assert_eq!(shmem_huge_bytes(text), Some(202_752 * 1024));
        assert_eq!(shmem_huge_bytes("Rss: 1 kB\n"), None);
    }
}
