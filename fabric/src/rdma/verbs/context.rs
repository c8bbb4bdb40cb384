//! An opened device: discovery and selection (the pure rules of
//! [`device`](crate::rdma::device)), the protection domain, memory
//! registration, and the one completion queue all of this process's queue
//! pairs on the device share, with its poller thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::completion::GenericCompletionQueue;
use sideway::ibverbs::device::{DeviceInfo, DeviceList, TransportType};
use sideway::ibverbs::device_context::{DeviceContext, LinkLayer as SwLinkLayer, Mtu, PortState};
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::protection_domain::ProtectionDomain;

use super::connection::ConnShared;
use super::events::{EventReader, EventTargets};
use super::poller::{Poller, WrKind};
use crate::memory::RegionMemory;
use crate::rdma::admission::Admission;
use crate::rdma::connections::Connections;
use crate::rdma::contexts::Health;
use crate::rdma::device::{
    GidCandidate, LinkLayer, PortCandidate, PortGids, gid_for_local_address,
    port_for_local_address, select_gid,
};
use crate::rdma::error::RdmaError;
use crate::rdma::qp_params::MAX_OUTSTANDING_READS;
use crate::rdma::wr_table::WrTable;

/// `ibv_query_gid_type`'s answer for a RoCE v2 GID (sysfs "RoCE v2").
const GID_TYPE_SYSFS_ROCE_V2: u32 = 1;
/// Completion-queue entries: bounds the requests in flight over every
/// connection of this context together (the work-request table's size).
pub const CQ_ENTRIES: u32 = 16 * 1024;

/// What was chosen, for the log line and the QP endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceChoice {
    pub device: String,
    pub port: u8,
    pub link_layer: LinkLayer,
    /// The port's default GID (used when the control connection's local
    /// address says nothing of the route, e.g. loopback).
    pub gid_index: u8,
    pub gid: [u8; 16],
    /// The port's GID table, for the per-connection choice.
    pub gids: Vec<GidCandidate>,
    pub lid: u16,
    pub mtu_bytes: u16,
    /// Outstanding READs as initiator / responder, clamped to the device.
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
}

impl DeviceChoice {
    /// The GID index and GID of a connection whose control socket's local
    /// address is `local` (see [`gid_for_local_address`]).
    pub fn gid_for(&self, local: Option<std::net::IpAddr>) -> Result<(u8, [u8; 16]), RdmaError> {
        let index = gid_for_local_address(
            &self.device,
            self.link_layer,
            &self.gids,
            self.gid_index,
            local,
        )?;
        let gid = self
            .gids
            .iter()
            .find(|g| g.index == index)
            .map_or(self.gid, |g| g.gid);
        Ok((index, gid))
    }
}

impl std::fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gid = std::net::Ipv6Addr::from(self.gid);
        write!(
            f,
            "{} port {} ({:?}, GID index {} {gid}, LID {}, MTU {})",
            self.device, self.port, self.link_layer, self.gid_index, self.lid, self.mtu_bytes
        )
    }
}

fn mtu_bytes(mtu: Mtu) -> u16 {
    match mtu {
        Mtu::Mtu256 => 256,
        Mtu::Mtu512 => 512,
        Mtu::Mtu1024 => 1024,
        Mtu::Mtu2048 => 2048,
        Mtu::Mtu4096 => 4096,
    }
}

/// The verbs MTU for a byte count the endpoint decoder already validated.
pub(crate) fn mtu_of_bytes(bytes: u16) -> Mtu {
    match bytes {
        4096 => Mtu::Mtu4096,
        2048 => Mtu::Mtu2048,
        1024 => Mtu::Mtu1024,
        512 => Mtu::Mtu512,
        _ => Mtu::Mtu256,
    }
}

fn link_layer(l: SwLinkLayer) -> LinkLayer {
    match l {
        SwLinkLayer::InfiniBand => LinkLayer::InfiniBand,
        SwLinkLayer::Ethernet => LinkLayer::Ethernet,
        SwLinkLayer::Unspecified => LinkLayer::Unspecified,
    }
}

/// A registered buffer: the mapping and its memory region, dropped together
/// (the region is deregistered before the mapping goes away: fields drop in
/// declaration order).
#[derive(Debug)]
pub struct Registered {
    pub mr: Arc<MemoryRegion>,
    pub memory: Arc<RegionMemory>,
}

impl Registered {
    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }

    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }

    pub fn addr(&self) -> u64 {
        self.memory.base_ptr() as u64
    }
}

#[derive(Debug)]
pub struct RdmaContext {
    pub choice: DeviceChoice,
    pd: Arc<ProtectionDomain>,
    pub(crate) cq: GenericCompletionQueue,
    pub(crate) table: Arc<Mutex<WrTable<WrKind>>>,
    /// Connections reserve their worst case of `table` here.
    pub(crate) admission: Arc<Admission>,
    poller: Mutex<Option<Poller>>,
    /// Its connections by QP number and port, for device events.
    pub(crate) connections: Arc<Connections<ConnShared>>,
    /// The device declared this context unusable (a fatal async event):
    /// the next connection through this port opens a new one.
    failed: Arc<AtomicBool>,
    events: Mutex<Option<EventReader>>,
    // Keeps the device open for the PD, CQ and MRs.
    _device: Arc<DeviceContext>,
}

impl Drop for RdmaContext {
    fn drop(&mut self) {
        if let Some(poller) = self.poller.lock().unwrap_or_else(|p| p.into_inner()).take() {
            poller.stop();
        }
        if let Some(events) = self.events.lock().unwrap_or_else(|p| p.into_inner()).take() {
            events.stop();
        }
    }
}

/// Why the device list could not be read, in an operator's words.
fn list_error(e: &sideway::ibverbs::device::GetDeviceListError) -> String {
    let sideway::ibverbs::device::GetDeviceListErrorKind::Ibverbs(io) = &e.0 else {
        return format!("listing rdma devices: {e}");
    };
    match rustix::io::Errno::from_io_error(io) {
        // rdma-mummy-sys's answer when it could not dlopen libibverbs.
        Some(rustix::io::Errno::OPNOTSUPP) => {
            "rdma-core (libibverbs.so.1) is not installed".to_owned()
        }
        // rdma-core's answer when the kernel has no RDMA devices or modules.
        Some(rustix::io::Errno::NOSYS) => {
            "no RDMA support in the kernel (no device, no rdma modules loaded)".to_owned()
        }
        _ => format!("listing rdma devices: {io}"),
    }
}

/// A port's GID table (read once, when the device is discovered).
fn gid_table(context: &DeviceContext, port: u8, len: i32) -> Vec<GidCandidate> {
    let len = u8::try_from(len.max(0)).unwrap_or(u8::MAX);
    let mut gids = Vec::new();
    for index in 0..len {
        let Ok(gid) = context.query_gid(port, u32::from(index)) else {
            continue;
        };
        let roce_v2 = context
            .query_gid_type(port, u32::from(index))
            .is_ok_and(|t| t == GID_TYPE_SYSFS_ROCE_V2);
        // The entry's netdev (ibv_query_gid_ex); its type is read above
        // (sideway's `GidEntry::gid_type` panics on a type it does not know).
        let netdev = context
            .query_gid_ex(port, u32::from(index))
            .map_or(0, |entry| entry.netdev_index());
        gids.push(GidCandidate {
            index,
            gid: gid.raw,
            roce_v2,
            netdev,
        });
    }
    gids
}

/// Every port of every device, with its state and GID table.
fn discover(list: &DeviceList) -> Vec<PortGids> {
    let mut ports = Vec::new();
    for device in list.iter() {
        let name = device.name();
        let iwarp = device.transport_type() == TransportType::IWarp;
        let Ok(context) = device.open() else {
            tracing::debug!(device = %name, "cannot open rdma device; skipped");
            continue;
        };
        let Ok(attr) = context.query_device() else {
            continue;
        };
        for port in 1..=attr.phys_port_cnt() {
            let Ok(port_attr) = context.query_port(port) else {
                continue;
            };
            ports.push(PortGids {
                port: PortCandidate {
                    device: name.clone(),
                    port,
                    active: port_attr.port_state() == PortState::Active,
                    link_layer: link_layer(port_attr.link_layer()),
                    iwarp,
                },
                gids: gid_table(&context, port, port_attr.gid_tbl_len()),
            });
        }
    }
    ports
}

/// Every port of every device on this host, or why RDMA is unavailable.
pub fn discover_ports() -> Result<Vec<PortGids>, RdmaError> {
    let list = DeviceList::new().map_err(|e| RdmaError::Unavailable(list_error(&e)))?;
    Ok(discover(&list))
}

impl Health for RdmaContext {
    fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }
}

impl RdmaContext {
    /// Opens the device named `wanted` (or the first with an active port),
    /// or says why RDMA is unavailable here.
    pub fn open(wanted: Option<&str>) -> Result<Arc<RdmaContext>, RdmaError> {
        let ports = discover_ports()?;
        let index = port_for_local_address(&ports, wanted, None)?;
        RdmaContext::open_port(&ports[index])
    }

    /// Opens the device of `port` (as [`discover_ports`] found it) for
    /// connections through that port.
    pub fn open_port(port: &PortGids) -> Result<Arc<RdmaContext>, RdmaError> {
        let chosen = &port.port;
        let list = DeviceList::new().map_err(|e| RdmaError::Unavailable(list_error(&e)))?;
        let device = list
            .iter()
            .find(|d| d.name() == chosen.device)
            .ok_or_else(|| RdmaError::Unavailable(format!("{} vanished", chosen.device)))?
            .open()
            .map_err(|e| RdmaError::verbs("ibv_open_device", e))?;
        let attr = device
            .query_device()
            .map_err(|e| RdmaError::verbs("ibv_query_device", e))?;
        let port_attr = device
            .query_port(chosen.port)
            .map_err(|e| RdmaError::verbs("ibv_query_port", e))?;
        let gids = port.gids.clone();
        let gid_index = select_gid(chosen.link_layer, &gids).ok_or_else(|| {
            RdmaError::Unavailable(format!(
                "{} port {} has no usable GID",
                chosen.device, chosen.port
            ))
        })?;
        let gid = gids
            .iter()
            .find(|g| g.index == gid_index)
            .map_or([0; 16], |g| g.gid);
        let clamp = |device_max: i32| {
            u8::try_from(device_max.max(1))
                .unwrap_or(u8::MAX)
                .min(MAX_OUTSTANDING_READS)
        };
        let choice = DeviceChoice {
            device: chosen.device.clone(),
            port: chosen.port,
            link_layer: chosen.link_layer,
            gid_index,
            gid,
            gids,
            lid: port_attr.lid(),
            mtu_bytes: mtu_bytes(port_attr.active_mtu()),
            max_rd_atomic: clamp(attr.max_qp_init_rd_atom()),
            max_dest_rd_atomic: clamp(attr.max_qp_rd_atom()),
        };
        let pd = device
            .alloc_pd()
            .map_err(|e| RdmaError::verbs("ibv_alloc_pd", e))?;
        let cq_entries = CQ_ENTRIES.min(u32::try_from(attr.max_cqe().max(1)).unwrap_or(1));
        let channel = device
            .create_comp_channel()
            .map_err(|e| RdmaError::verbs("ibv_create_comp_channel", e))?;
        let cq = GenericCompletionQueue::from(
            device
                .create_cq_builder()
                .setup_cqe(cq_entries)
                .setup_comp_channel(&channel, 0)
                .build()
                .map_err(|e| RdmaError::verbs("ibv_create_cq", e))?,
        );
        let table = Arc::new(Mutex::new(WrTable::new(cq_entries)));
        let targets = EventTargets {
            connections: Arc::new(Connections::default()),
            failed: Arc::new(AtomicBool::new(false)),
        };
        let poller = Poller::start(
            cq.clone(),
            channel,
            Arc::clone(&table),
            Arc::clone(&targets.failed),
            &choice.device,
        )?;
        let events = match EventReader::start(Arc::clone(&device), targets.clone(), &choice.device)
        {
            Ok(events) => events,
            Err(e) => {
                poller.stop();
                return Err(e);
            }
        };
        Ok(Arc::new(RdmaContext {
            choice,
            pd,
            cq,
            table,
            admission: Admission::new(cq_entries),
            poller: Mutex::new(Some(poller)),
            connections: targets.connections,
            failed: targets.failed,
            events: Mutex::new(Some(events)),
            _device: device,
        }))
    }

    pub(crate) fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    pub(crate) fn table(&self) -> MutexGuard<'_, WrTable<WrKind>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `memory` with `access` (local read is implied).
    pub fn register(
        &self,
        memory: Arc<RegionMemory>,
        access: AccessFlags,
    ) -> Result<Registered, RdmaError> {
        // SAFETY: `memory` is a live mapping of `len_bytes()` bytes, and the
        // returned `Registered` keeps the `Arc` to it for as long as the
        // memory region exists (the MR is dropped first), so the NIC never
        // accesses unmapped memory. The mapping is only ever accessed through
        // atomics by the CPU (invariant 5), so DMA into it races with no
        // reference.
        let mr = unsafe {
            self.pd
                .reg_mr(memory.base_ptr() as usize, memory.len_bytes(), access)
        }
        .map_err(|e| RdmaError::verbs("ibv_reg_mr", e))?;
        Ok(Registered { mr, memory })
    }

    /// Anonymous memory of `len_bytes` registered for local writes (receive
    /// and read buffers) and local reads (send buffers).
    pub fn register_buffers(&self, len_bytes: usize) -> Result<Registered, RdmaError> {
        let memory = RegionMemory::anonymous(len_bytes)
            .map_err(|e| RdmaError::verbs("mmap of rdma buffers", e))?;
        self.register(Arc::new(memory), AccessFlags::LocalWrite)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdma::device::SelectError;

    /// On a host without rdma-core or without that device, opening says why
    /// (the node logs it and falls back) instead of panicking.
    #[test]
    fn a_missing_device_is_a_reason_not_a_crash() {
        match RdmaContext::open(Some("rdkv-no-such-device")) {
            Err(RdmaError::Unavailable(reason)) => {
                assert!(!reason.is_empty());
                eprintln!("rdma unavailable here: {reason}");
            }
            Err(RdmaError::Select(SelectError::NoDevices | SelectError::NoSuchDevice { .. })) => {}
            other => panic!("unexpected: {other:?}"),
        }
    }
}
