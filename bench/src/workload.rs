//! YCSB's `CoreWorkload`: the properties it reads, the key and operation
//! choosers it builds from them, and the operations it issues, following
//! `site.ycsb.workloads.CoreWorkload`.
//!
//! One [`Workload`] is shared by a run (the insert counters live here); each
//! task draws from its own [`OpGenerator`] with its own seeded stream.

use std::sync::Arc;

use bytes::Bytes;
use thiserror::Error;

use crate::generator::{
    AcknowledgedCounterGenerator, CounterGenerator, DiscreteGenerator, HotspotError,
    HotspotIntegerGenerator, Rng, ScrambledZipfianGenerator, SkewedLatestGenerator,
    TooManyUnacknowledged, UniformLongGenerator, ZipfianGenerator, fnvhash64,
};
use crate::properties::{Properties, PropertyError};
use crate::record::{self, RecordWriter};

#[derive(Debug, Error)]
pub enum WorkloadError {
    #[error(transparent)]
    Property(#[from] PropertyError),
    #[error(transparent)]
    Hotspot(#[from] HotspotError),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Insert(#[from] TooManyUnacknowledged),
}

/// The operations of CoreWorkload, with YCSB's measurement names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    Read,
    Update,
    Insert,
    Scan,
    ReadModifyWrite,
}

impl OpKind {
    pub const ALL: [OpKind; 5] = [
        OpKind::Read,
        OpKind::Update,
        OpKind::Insert,
        OpKind::Scan,
        OpKind::ReadModifyWrite,
    ];

    /// The name YCSB prints (`[READ]`, `[READ-MODIFY-WRITE]`).
    pub fn label(self) -> &'static str {
        match self {
            OpKind::Read => "READ",
            OpKind::Update => "UPDATE",
            OpKind::Insert => "INSERT",
            OpKind::Scan => "SCAN",
            OpKind::ReadModifyWrite => "READ-MODIFY-WRITE",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestDistribution {
    Uniform,
    Zipfian,
    Latest,
    Hotspot,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LengthDistribution {
    Constant,
    Uniform,
    Zipfian,
}

/// CoreWorkload's properties, validated. Defaults are YCSB's.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadSpec {
    pub record_count: u64,
    pub operation_count: u64,
    pub insert_start: u64,
    pub insert_count: u64,
    pub field_count: u64,
    pub field_length: u64,
    pub field_length_distribution: LengthDistribution,
    pub read_proportion: f64,
    pub update_proportion: f64,
    pub insert_proportion: f64,
    pub scan_proportion: f64,
    pub read_modify_write_proportion: f64,
    pub request_distribution: RequestDistribution,
    pub min_scan_length: u64,
    pub max_scan_length: u64,
    pub scan_length_distribution: LengthDistribution,
    pub read_all_fields: bool,
    pub write_all_fields: bool,
    pub ordered_inserts: bool,
    pub zero_padding: u64,
    pub hotspot_data_fraction: f64,
    pub hotspot_opn_fraction: f64,
    pub field_name_prefix: String,
}

/// Properties YCSB itself (not CoreWorkload) reads, accepted silently.
pub const FRAMEWORK_PROPERTIES: &[&str] = &[
    "workload",
    "db",
    "exporter",
    "exportfile",
    "threadcount",
    "target",
    "measurementtype",
    "measurement.interval",
    "maxexecutiontime",
    "status.interval",
    "table",
    "hdrhistogram.percentiles",
    "histogram.buckets",
    "dataintegrity",
    "readallfieldsbyname",
    "filterproportion",
    "insertionretrylimit",
    "insertionretryinterval",
    "core_workload_insertion_retry_limit",
    "core_workload_insertion_retry_interval",
];

/// The properties CoreWorkload reads (and this port honours).
pub const WORKLOAD_PROPERTIES: &[&str] = &[
    "recordcount",
    "operationcount",
    "insertstart",
    "insertcount",
    "fieldcount",
    "fieldlength",
    "fieldlengthdistribution",
    "fieldnameprefix",
    "readproportion",
    "updateproportion",
    "insertproportion",
    "scanproportion",
    "readmodifywriteproportion",
    "requestdistribution",
    "minscanlength",
    "maxscanlength",
    "scanlengthdistribution",
    "readallfields",
    "writeallfields",
    "insertorder",
    "zeropadding",
    "hotspotdatafraction",
    "hotspotopnfraction",
];

impl WorkloadSpec {
    pub fn from_properties(p: &Properties) -> Result<WorkloadSpec, WorkloadError> {
        let record_count = p.u64("recordcount", 0)?;
        let insert_start = p.u64("insertstart", 0)?;
        let insert_count = p.u64("insertcount", record_count.saturating_sub(insert_start))?;
        if record_count < insert_start + insert_count {
            return Err(WorkloadError::Invalid(format!(
                "invalid combination of insertstart ({insert_start}), insertcount ({insert_count}) \
                 and recordcount ({record_count}): recordcount must be at least insertstart + insertcount"
            )));
        }
        let length_distribution = |name: &str| -> Result<LengthDistribution, WorkloadError> {
            Ok(
                match p
                    .choice(name, "constant", &["constant", "uniform", "zipfian"])?
                    .as_str()
                {
                    "uniform" => LengthDistribution::Uniform,
                    "zipfian" => LengthDistribution::Zipfian,
                    _ => LengthDistribution::Constant,
                },
            )
        };
        let request_distribution = match p
            .choice(
                "requestdistribution",
                "uniform",
                &["uniform", "zipfian", "latest", "hotspot"],
            )?
            .as_str()
        {
            "zipfian" => RequestDistribution::Zipfian,
            "latest" => RequestDistribution::Latest,
            "hotspot" => RequestDistribution::Hotspot,
            _ => RequestDistribution::Uniform,
        };
        let scan_length_distribution = match p
            .choice("scanlengthdistribution", "uniform", &["uniform", "zipfian"])?
            .as_str()
        {
            "zipfian" => LengthDistribution::Zipfian,
            _ => LengthDistribution::Uniform,
        };
        let spec = WorkloadSpec {
            record_count,
            operation_count: p.u64("operationcount", 0)?,
            insert_start,
            insert_count,
            field_count: p.u64("fieldcount", 10)?,
            field_length: p.u64("fieldlength", 100)?,
            field_length_distribution: length_distribution("fieldlengthdistribution")?,
            read_proportion: p.fraction("readproportion", 0.95)?,
            update_proportion: p.fraction("updateproportion", 0.05)?,
            insert_proportion: p.fraction("insertproportion", 0.0)?,
            scan_proportion: p.fraction("scanproportion", 0.0)?,
            read_modify_write_proportion: p.fraction("readmodifywriteproportion", 0.0)?,
            request_distribution,
            min_scan_length: p.u64("minscanlength", 1)?,
            max_scan_length: p.u64("maxscanlength", 1000)?,
            scan_length_distribution,
            read_all_fields: p.bool("readallfields", true)?,
            write_all_fields: p.bool("writeallfields", false)?,
            ordered_inserts: p.choice("insertorder", "hashed", &["hashed", "ordered"])?
                == "ordered",
            zero_padding: p.u64("zeropadding", 1)?,
            hotspot_data_fraction: p.fraction("hotspotdatafraction", 0.2)?,
            hotspot_opn_fraction: p.fraction("hotspotopnfraction", 0.8)?,
            field_name_prefix: p.string("fieldnameprefix", "field"),
        };
        if spec.field_count == 0 || spec.field_count > 1024 {
            return Err(WorkloadError::Invalid(format!(
                "fieldcount must be between 1 and 1024, got {}",
                spec.field_count
            )));
        }
        if spec.field_length == 0 || spec.field_length > 1 << 20 {
            return Err(WorkloadError::Invalid(format!(
                "fieldlength must be between 1 and 1048576, got {}",
                spec.field_length
            )));
        }
        if spec.min_scan_length == 0 || spec.min_scan_length > spec.max_scan_length {
            return Err(WorkloadError::Invalid(format!(
                "scan lengths: need 1 <= minscanlength ({}) <= maxscanlength ({})",
                spec.min_scan_length, spec.max_scan_length
            )));
        }
        if spec.proportion_sum() <= 0.0 {
            return Err(WorkloadError::Invalid(
                "every operation proportion is 0: set readproportion, updateproportion, ...".into(),
            ));
        }
        Ok(spec)
    }

    fn proportion_sum(&self) -> f64 {
        self.read_proportion
            + self.update_proportion
            + self.insert_proportion
            + self.scan_proportion
            + self.read_modify_write_proportion
    }

    /// Bytes of one record as stored (the largest, if lengths vary).
    pub fn record_bytes(&self) -> usize {
        let value_len = self.field_length as usize;
        let names = self.field_names();
        record::encoded_len(names.iter().map(|name| (name.as_str(), value_len)))
    }

    /// The records' field names: the prefix and the field's number.
    fn field_names(&self) -> Vec<String> {
        (0..self.field_count)
            .map(|i| format!("{}{i}", self.field_name_prefix))
            .collect()
    }

    /// Property names that neither CoreWorkload nor YCSB's framework reads:
    /// probably typos, reported as warnings.
    pub fn unknown_properties(p: &Properties) -> Vec<String> {
        p.names()
            .filter(|n| !WORKLOAD_PROPERTIES.contains(n) && !FRAMEWORK_PROPERTIES.contains(n))
            .map(str::to_owned)
            .collect()
    }
}

/// CoreWorkload.buildKeyName: `user` + the key number, FNV-64 hashed unless
/// `insertorder=ordered`, left-padded with zeros to `zeropadding` digits.
pub fn build_key_name(keynum: i64, ordered: bool, zero_padding: u64) -> String {
    let mut key = String::new();
    write_key_name(keynum, ordered, zero_padding, &mut key);
    key
}

/// [`build_key_name`] into `key`, replacing what it held: a generator
/// writes each operation's key into the string of an operation done
/// (`OpGenerator::recycle`), so a run allocates no key per operation. The
/// digits are written by hand, right to left, rather than through the
/// formatting machinery, which cost a one-sided read's runner a few per
/// cent.
pub fn write_key_name(keynum: i64, ordered: bool, zero_padding: u64, key: &mut String) {
    let keynum = if ordered { keynum } else { fnvhash64(keynum) };
    let mut digits = [0u8; 20];
    let mut first = digits.len();
    let mut rest = keynum.unsigned_abs();
    loop {
        first -= 1;
        digits[first] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    let sign = if keynum < 0 { "-" } else { "" };
    let width = digits.len() - first + sign.len();
    let fill = (zero_padding as usize).saturating_sub(width);
    key.clear();
    key.reserve(4 + fill + width);
    key.push_str("user");
    key.extend(std::iter::repeat_n('0', fill));
    key.push_str(sign);
    key.extend(digits[first..].iter().map(|&d| char::from(d)));
}

/// One operation to issue.
#[derive(Debug, Clone, PartialEq)]
pub enum Operation {
    Read {
        key: String,
        /// `None`: all fields (readallfields).
        field: Option<String>,
    },
    Update {
        key: String,
        value: Bytes,
    },
    Insert {
        key: String,
        keynum: i64,
        value: Bytes,
        /// Run-phase inserts are acknowledged to the insert counter when done.
        acknowledge: bool,
    },
    Scan {
        start_key: String,
        count: usize,
        field: Option<String>,
    },
    ReadModifyWrite {
        key: String,
        field: Option<String>,
        value: Bytes,
    },
}

impl Operation {
    pub fn kind(&self) -> OpKind {
        match self {
            Operation::Read { .. } => OpKind::Read,
            Operation::Update { .. } => OpKind::Update,
            Operation::Insert { .. } => OpKind::Insert,
            Operation::Scan { .. } => OpKind::Scan,
            Operation::ReadModifyWrite { .. } => OpKind::ReadModifyWrite,
        }
    }
}

#[derive(Debug, Clone)]
enum KeyChooser {
    Uniform(UniformLongGenerator),
    Zipfian(ScrambledZipfianGenerator),
    Latest(SkewedLatestGenerator),
    Hotspot(HotspotIntegerGenerator),
}

#[derive(Debug, Clone)]
enum LengthGenerator {
    Constant(i64),
    Uniform(UniformLongGenerator),
    Zipfian(ZipfianGenerator),
}

impl LengthGenerator {
    fn new(distribution: LengthDistribution, min: u64, max: u64) -> LengthGenerator {
        match distribution {
            LengthDistribution::Constant => LengthGenerator::Constant(max as i64),
            LengthDistribution::Uniform => {
                LengthGenerator::Uniform(UniformLongGenerator::new(min as i64, max as i64))
            }
            LengthDistribution::Zipfian => {
                LengthGenerator::Zipfian(ZipfianGenerator::new(min as i64, max as i64))
            }
        }
    }

    fn next(&mut self, rng: &mut Rng) -> u64 {
        let v = match self {
            LengthGenerator::Constant(v) => *v,
            LengthGenerator::Uniform(g) => g.next_value(rng),
            LengthGenerator::Zipfian(g) => g.next_value(rng),
        };
        v.max(1) as u64
    }
}

/// The shared state of a run and the prototypes every task clones.
#[derive(Debug)]
pub struct Workload {
    pub spec: WorkloadSpec,
    /// Load phase: the next record to insert.
    key_sequence: CounterGenerator,
    /// Run phase: inserts continue after the loaded records.
    transaction_insert_key_sequence: Arc<AcknowledgedCounterGenerator>,
    operation_chooser: DiscreteGenerator<OpKind>,
    field_names: Vec<String>,
    /// Bytes of the largest record (`WorkloadSpec::record_bytes`), the
    /// buffer each record is built in.
    record_capacity: usize,
    key_chooser: KeyChooser,
    field_length: LengthGenerator,
    scan_length: LengthGenerator,
}

impl Workload {
    pub fn new(spec: WorkloadSpec) -> Result<Workload, WorkloadError> {
        let mut operation_chooser = DiscreteGenerator::new();
        for (proportion, kind) in [
            (spec.read_proportion, OpKind::Read),
            (spec.update_proportion, OpKind::Update),
            (spec.insert_proportion, OpKind::Insert),
            (spec.scan_proportion, OpKind::Scan),
            (spec.read_modify_write_proportion, OpKind::ReadModifyWrite),
        ] {
            if proportion > 0.0 {
                operation_chooser.add_value(proportion, kind);
            }
        }
        let transaction_insert_key_sequence =
            Arc::new(AcknowledgedCounterGenerator::new(spec.record_count as i64));
        let first = spec.insert_start as i64;
        let last = first + spec.insert_count as i64 - 1;
        let key_chooser = match spec.request_distribution {
            RequestDistribution::Uniform => {
                KeyChooser::Uniform(UniformLongGenerator::new(first, last))
            }
            RequestDistribution::Zipfian => {
                // Room for the keys inserted during the run, as YCSB leaves it.
                let expected_new_keys =
                    (spec.operation_count as f64 * spec.insert_proportion * 2.0) as i64;
                KeyChooser::Zipfian(ScrambledZipfianGenerator::new(
                    first,
                    last + 1 + expected_new_keys,
                ))
            }
            RequestDistribution::Latest => {
                if spec.record_count < 2 {
                    return Err(WorkloadError::Invalid(
                        "requestdistribution=latest needs recordcount >= 2".into(),
                    ));
                }
                KeyChooser::Latest(SkewedLatestGenerator::new(Arc::clone(
                    &transaction_insert_key_sequence,
                )))
            }
            RequestDistribution::Hotspot => KeyChooser::Hotspot(HotspotIntegerGenerator::new(
                first,
                last,
                spec.hotspot_data_fraction,
                spec.hotspot_opn_fraction,
            )?),
        };
        let field_names = spec.field_names();
        Ok(Workload {
            key_sequence: CounterGenerator::new(spec.insert_start as i64),
            transaction_insert_key_sequence,
            operation_chooser,
            field_names,
            record_capacity: spec.record_bytes(),
            key_chooser,
            field_length: LengthGenerator::new(
                spec.field_length_distribution,
                1,
                spec.field_length,
            ),
            scan_length: LengthGenerator::new(
                spec.scan_length_distribution,
                spec.min_scan_length,
                spec.max_scan_length,
            ),
            spec,
        })
    }

    pub fn from_properties(p: &Properties) -> Result<Workload, WorkloadError> {
        Workload::new(WorkloadSpec::from_properties(p)?)
    }

    /// Whether the run phase issues this kind of operation.
    pub fn issues(&self, kind: OpKind) -> bool {
        let p = &self.spec;
        match kind {
            OpKind::Read => p.read_proportion > 0.0,
            OpKind::Update => p.update_proportion > 0.0,
            OpKind::Insert => p.insert_proportion > 0.0,
            OpKind::Scan => p.scan_proportion > 0.0,
            OpKind::ReadModifyWrite => p.read_modify_write_proportion > 0.0,
        }
    }

    /// A generator for one task, drawing from stream `stream` of `seed`.
    pub fn generator(self: &Arc<Self>, seed: u64, stream: u64) -> OpGenerator {
        OpGenerator {
            workload: Arc::clone(self),
            rng: Rng::for_stream(seed, stream),
            key_chooser: self.key_chooser.clone(),
            field_length: self.field_length.clone(),
            scan_length: self.scan_length.clone(),
            field_chooser: UniformLongGenerator::new(0, self.spec.field_count as i64 - 1),
            spare_key: None,
        }
    }

    /// Marks a run-phase insert done (succeeded or not), so the key becomes
    /// eligible for reads.
    pub fn acknowledge_insert(&self, keynum: i64) -> Result<(), TooManyUnacknowledged> {
        self.transaction_insert_key_sequence.acknowledge(keynum)
    }
}

/// One task's stream of operations.
#[derive(Debug)]
pub struct OpGenerator {
    workload: Arc<Workload>,
    rng: Rng,
    key_chooser: KeyChooser,
    field_length: LengthGenerator,
    scan_length: LengthGenerator,
    field_chooser: UniformLongGenerator,
    /// The key string of an operation done, for the next key.
    spare_key: Option<String>,
}

impl OpGenerator {
    fn key_name(&mut self, keynum: i64) -> String {
        let spec = &self.workload.spec;
        // Room for "user", a sign and 20 digits: reused, it never grows
        // unless `zeropadding` asks for more.
        let mut key = self
            .spare_key
            .take()
            .unwrap_or_else(|| String::with_capacity(32));
        write_key_name(keynum, spec.ordered_inserts, spec.zero_padding, &mut key);
        key
    }

    /// Takes back an operation done, so that its key's string holds the
    /// next operation's key.
    pub fn recycle(&mut self, operation: Operation) {
        let key = match operation {
            Operation::Read { key, .. }
            | Operation::Update { key, .. }
            | Operation::Insert { key, .. }
            | Operation::ReadModifyWrite { key, .. } => key,
            Operation::Scan { start_key, .. } => start_key,
        };
        self.spare_key = Some(key);
    }

    /// A full record of random printable bytes (YCSB's RandomByteIterator
    /// draws from the same 64 characters, eight from each draw here, low
    /// bits first), written straight into the record's one buffer: values
    /// built apart and copied in cost the client a tenth of its CPU in an
    /// update-only run.
    pub fn build_record(&mut self) -> Bytes {
        let mut record = RecordWriter::with_capacity(self.workload.record_capacity);
        for name in &self.workload.field_names {
            let len = self.field_length.next(&mut self.rng) as usize;
            for chunk in record.field(name, len).chunks_mut(8) {
                let mut word = self.rng.next_u64();
                for byte in chunk {
                    *byte = b' ' + (word & 63) as u8;
                    word >>= 8;
                }
            }
        }
        record.finish()
    }

    /// `doInsert` of the load phase: the next key of the sequence.
    pub fn next_load_insert(&mut self) -> Operation {
        let keynum = self.workload.key_sequence.next_value();
        Operation::Insert {
            key: self.key_name(keynum),
            keynum,
            value: self.build_record(),
            acknowledge: false,
        }
    }

    /// `nextKeynum`: a key chosen by the request distribution among the keys
    /// whose insert has been acknowledged.
    fn next_keynum(&mut self) -> i64 {
        let limit = self.workload.transaction_insert_key_sequence.last_value();
        loop {
            let keynum = match &mut self.key_chooser {
                KeyChooser::Uniform(g) => g.next_value(&mut self.rng),
                KeyChooser::Zipfian(g) => g.next_value(&mut self.rng),
                KeyChooser::Latest(g) => g.next_value(&mut self.rng),
                KeyChooser::Hotspot(g) => g.next_value(&mut self.rng),
            };
            if keynum <= limit {
                return keynum;
            }
        }
    }

    fn next_key(&mut self) -> String {
        let keynum = self.next_keynum();
        self.key_name(keynum)
    }

    fn read_field(&mut self) -> Option<String> {
        if self.workload.spec.read_all_fields {
            None
        } else {
            let i = self.field_chooser.next_value(&mut self.rng) as usize;
            self.workload.field_names.get(i).cloned()
        }
    }

    /// `doTransaction`: an operation chosen by the proportions.
    pub fn next_transaction(&mut self) -> Operation {
        let kind = self
            .workload
            .operation_chooser
            .next_value(&mut self.rng)
            .unwrap_or(OpKind::Read);
        match kind {
            OpKind::Read => {
                let key = self.next_key();
                Operation::Read {
                    key,
                    field: self.read_field(),
                }
            }
            OpKind::Update => {
                let key = self.next_key();
                Operation::Update {
                    key,
                    value: self.build_record(),
                }
            }
            OpKind::Insert => {
                let keynum = self.workload.transaction_insert_key_sequence.next_value();
                Operation::Insert {
                    key: self.key_name(keynum),
                    keynum,
                    value: self.build_record(),
                    acknowledge: true,
                }
            }
            OpKind::Scan => {
                let start_key = self.next_key();
                let count = self.scan_length.next(&mut self.rng) as usize;
                Operation::Scan {
                    start_key,
                    count,
                    field: self.read_field(),
                }
            }
            OpKind::ReadModifyWrite => {
                let key = self.next_key();
                let field = self.read_field();
                Operation::ReadModifyWrite {
                    key,
                    field,
                    value: self.build_record(),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn workload_file(name: &str) -> Properties {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("workloads")
            .join(name);
        let mut p = Properties::new();
        p.load_file(&path).unwrap();
        p
    }

    #[test]
    fn key_names_are_user_plus_the_fnv_hash() {
        assert_eq!(build_key_name(0, false, 1), "user6284781860667377211");
        assert_eq!(build_key_name(1, false, 1), "user8517097267634966620");
        assert_eq!(build_key_name(42, false, 1), "user55488592825689361");
        assert_eq!(build_key_name(42, true, 1), "user42");
        assert_eq!(build_key_name(42, true, 5), "user00042");
        assert_eq!(build_key_name(0, true, 1), "user0");
        assert_eq!(build_key_name(-42, true, 5), "user00-42");
        assert_eq!(
            build_key_name(i64::MIN, true, 1),
            "user-9223372036854775808"
        );
        assert_eq!(build_key_name(i64::MAX, true, 1), "user9223372036854775807");
    }

    /// Each standard workload's run phase issues its operations in YCSB's
    /// proportions.
    #[test]
    fn operation_proportions_match_each_workload_file() {
        let expected: [(&str, [f64; 5]); 6] = [
            ("workloada", [0.5, 0.5, 0.0, 0.0, 0.0]),
            ("workloadb", [0.95, 0.05, 0.0, 0.0, 0.0]),
            ("workloadc", [1.0, 0.0, 0.0, 0.0, 0.0]),
            ("workloadd", [0.95, 0.0, 0.05, 0.0, 0.0]),
            ("workloade", [0.0, 0.0, 0.05, 0.95, 0.0]),
            ("workloadf", [0.5, 0.0, 0.0, 0.0, 0.5]),
        ];
        for (name, shares) in expected {
            let mut p = workload_file(name);
            p.set("recordcount", "1000");
            p.set("operationcount", "20000");
            let workload = Arc::new(Workload::from_properties(&p).unwrap());
            let mut generator = workload.generator(1, 0);
            let draws = 20_000;
            let mut counts = [0u32; 5];
            for _ in 0..draws {
                let op = generator.next_transaction();
                if let Operation::Insert { keynum, .. } = &op {
                    workload.acknowledge_insert(*keynum).unwrap();
                }
                let i = OpKind::ALL.iter().position(|k| *k == op.kind()).unwrap();
                counts[i] += 1;
            }
            for (kind, (count, share)) in OpKind::ALL.iter().zip(counts.iter().zip(shares)) {
                let measured = f64::from(*count) / f64::from(draws);
                assert!(
                    (measured - share).abs() < 0.015,
                    "{name} {kind:?}: {measured} vs {share}"
                );
            }
        }
    }

    #[test]
    fn workload_files_set_ycsb_values() {
        let a = WorkloadSpec::from_properties(&workload_file("workloada")).unwrap();
        assert_eq!(a.record_count, 1000);
        assert_eq!(a.operation_count, 1000);
        assert_eq!(a.request_distribution, RequestDistribution::Zipfian);
        assert!(a.read_all_fields && !a.write_all_fields);
        assert_eq!((a.field_count, a.field_length), (10, 100));
        let d = WorkloadSpec::from_properties(&workload_file("workloadd")).unwrap();
        assert_eq!(d.request_distribution, RequestDistribution::Latest);
        let e = WorkloadSpec::from_properties(&workload_file("workloade")).unwrap();
        assert_eq!(e.max_scan_length, 100);
        assert_eq!(e.scan_length_distribution, LengthDistribution::Uniform);
    }

    #[test]
    fn reads_only_pick_loaded_or_acknowledged_keys() {
        let mut p = workload_file("workloadd");
        p.set("recordcount", "100");
        p.set("operationcount", "1000");
        let workload = Arc::new(Workload::from_properties(&p).unwrap());
        let mut generator = workload.generator(3, 0);
        let loaded: std::collections::HashSet<String> =
            (0..100).map(|k| build_key_name(k, false, 1)).collect();
        let mut inserted = std::collections::HashSet::new();
        for _ in 0..5000 {
            match generator.next_transaction() {
                Operation::Read { key, .. } => {
                    assert!(loaded.contains(&key) || inserted.contains(&key), "{key}")
                }
                Operation::Insert { key, keynum, .. } => {
                    assert!(keynum >= 100);
                    workload.acknowledge_insert(keynum).unwrap();
                    inserted.insert(key);
                }
                other => panic!("workload d issued {other:?}"),
            }
        }
    }

    #[test]
    fn records_have_fieldcount_fields_of_fieldlength() {
        let mut p = Properties::new();
        p.set("recordcount", "10");
        let workload = Arc::new(Workload::from_properties(&p).unwrap());
        let mut generator = workload.generator(1, 0);
        let record = generator.build_record();
        assert_eq!(record.len(), workload.spec.record_bytes());
        let fields = record::decode(&record).unwrap();
        assert_eq!(fields.len(), 10);
        assert!(fields.iter().all(|(_, v)| v.len() == 100));
        assert_eq!(fields[3].0, "field3");
        // The load phase inserts keys 0, 1, 2, ... in hashed order.
        match generator.next_load_insert() {
            Operation::Insert { key, keynum: 0, .. } => assert_eq!(key, "user6284781860667377211"),
            other => panic!("{other:?}"),
        }
    }

    /// The record built in place holds the bytes of the loop it replaced
    /// (each value its own `Vec`, eight characters per draw): the same
    /// draws, in the same order, for every length distribution.
    #[test]
    fn records_are_the_bytes_of_values_built_one_by_one() {
        for distribution in ["constant", "uniform", "zipfian"] {
            let mut p = Properties::new();
            p.set("recordcount", "10");
            p.set("fieldlength", "37");
            p.set("fieldlengthdistribution", distribution);
            let workload = Arc::new(Workload::from_properties(&p).unwrap());
            let mut in_place = workload.generator(7, 3);
            let mut one_by_one = workload.generator(7, 3);
            for _ in 0..20 {
                let mut values = Vec::new();
                for _ in 0..workload.field_names.len() {
                    let len = one_by_one.field_length.next(&mut one_by_one.rng) as usize;
                    let mut value = Vec::with_capacity(len);
                    while value.len() < len {
                        let mut word = one_by_one.rng.next_u64();
                        for _ in 0..8.min(len - value.len()) {
                            value.push(b' ' + (word & 63) as u8);
                            word >>= 8;
                        }
                    }
                    values.push(value);
                }
                let expected = record::encode(
                    workload
                        .field_names
                        .iter()
                        .map(String::as_str)
                        .zip(values.iter().map(Vec::as_slice)),
                );
                assert_eq!(in_place.build_record(), expected, "{distribution}");
            }
        }
    }

    #[test]
    fn bad_workloads_are_refused_clearly() {
        let mut p = Properties::new();
        p.set("recordcount", "10");
        p.set("requestdistribution", "pareto");
        let err = Workload::from_properties(&p).unwrap_err().to_string();
        assert!(
            err.contains("requestdistribution") && err.contains("zipfian"),
            "{err}"
        );
        let mut p = Properties::new();
        p.set("recordcount", "10");
        p.set("insertcount", "20");
        let err = Workload::from_properties(&p).unwrap_err().to_string();
        assert!(err.contains("insertcount"), "{err}");
        let mut p = Properties::new();
        p.set("recordcount", "10");
        p.set("readproportion", "0");
        p.set("updateproportion", "0");
        assert!(Workload::from_properties(&p).is_err());
        let mut p = Properties::new();
        p.set("minscanlength", "10");
        p.set("maxscanlength", "5");
        assert!(Workload::from_properties(&p).is_err());
        p.set("readallfields", "yes");
        assert!(WorkloadSpec::from_properties(&p).is_err());
    }
}
