//! The opened devices of a process, one per route: each connection goes
//! through the device and port whose GID table holds its control socket's
//! local address ([`port_for_local_address`]), and the context (protection
//! domain, completion queue, poller; the client's read pool, the server's
//! region registration) of that port is opened on first use and shared by
//! every later connection through it. Before, one device was chosen per
//! process, so with two NICs the connections routed through the other one
//! reached RTR and then every request failed.
//!
//! Generic over what a context is, so the choice and the cache are tested
//! with fakes; `verbs` instantiates it with real contexts.

use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use super::device::{PortGids, SelectError, port_for_local_address};

/// A context the device declared unusable (`IBV_EVENT_DEVICE_FATAL`, a
/// completion-queue error) is replaced by a new one on the next connection.
pub trait Health {
    fn has_failed(&self) -> bool;
}

/// Which device and port: the key of an opened context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub device: String,
    pub port: u8,
}

impl Route {
    fn of(port: &PortGids) -> Route {
        Route {
            device: port.port.device.clone(),
            port: port.port.port,
        }
    }
}

/// The discovered ports (with their GID tables, read when RDMA was turned
/// on) and the contexts opened so far.
#[derive(Debug)]
pub struct DeviceContexts<C> {
    ports: Vec<PortGids>,
    /// `--rdma-device` / `RDKV_RDMA_DEVICE`: when set, every connection
    /// uses it (a refusal names it when it lacks the address).
    wanted: Option<String>,
    open: Mutex<Vec<(Route, Arc<C>)>>,
}

impl<C: Health> DeviceContexts<C> {
    /// Fails as selection does when no usable port exists at all.
    pub fn new(ports: Vec<PortGids>, wanted: Option<&str>) -> Result<Self, SelectError> {
        port_for_local_address(&ports, wanted, None)?;
        Ok(DeviceContexts {
            ports,
            wanted: wanted.filter(|w| !w.is_empty()).map(str::to_owned),
            open: Mutex::new(Vec::new()),
        })
    }

    fn open_contexts(&self) -> MutexGuard<'_, Vec<(Route, Arc<C>)>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The context for a connection whose control socket's local address
    /// is `local` (`None`: the default port), opened with `open` if no
    /// usable one is open yet. Opening runs under the lock: two sessions
    /// through a new port open it once.
    pub fn context_for<E: From<SelectError>>(
        &self,
        local: Option<IpAddr>,
        open: impl FnOnce(&PortGids) -> Result<Arc<C>, E>,
    ) -> Result<Arc<C>, E> {
        let index = port_for_local_address(&self.ports, self.wanted.as_deref(), local)?;
        let port = &self.ports[index];
        let route = Route::of(port);
        let mut opened = self.open_contexts();
        opened.retain(|(_, c)| !c.has_failed());
        if let Some((_, context)) = opened.iter().find(|(r, _)| *r == route) {
            return Ok(Arc::clone(context));
        }
        let context = open(port)?;
        opened.push((route, Arc::clone(&context)));
        Ok(context)
    }

    /// Every usable context opened so far (the server keeps each one's
    /// region registration current).
    pub fn opened(&self) -> Vec<Arc<C>> {
        self.open_contexts()
            .iter()
            .filter(|(_, c)| !c.has_failed())
            .map(|(_, c)| Arc::clone(c))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::rdma::device::{GidCandidate, LinkLayer, PortCandidate};

    #[derive(Debug)]
    struct FakeDevice {
        route: Route,
        failed: AtomicBool,
    }

    impl Health for FakeDevice {
        fn has_failed(&self) -> bool {
            self.failed.load(Ordering::Relaxed)
        }
    }

    fn mapped(ip: [u8; 4]) -> [u8; 16] {
        std::net::Ipv4Addr::from(ip).to_ipv6_mapped().octets()
    }

    /// A RoCE port whose netdev `netdev` carries `ip` (GID 0: link-local,
    /// GID 1: the address as RoCE v2).
    fn nic(device: &str, netdev: u32, ip: [u8; 4]) -> PortGids {
        let link_local = [
            0xfe,
            0x80,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            netdev as u8,
        ];
        let gid = |index, gid| GidCandidate {
            index,
            gid,
            roce_v2: true,
            netdev,
        };
        PortGids {
            port: PortCandidate {
                device: device.into(),
                port: 1,
                active: true,
                link_layer: LinkLayer::Ethernet,
                iwarp: false,
            },
            gids: vec![gid(0, link_local), gid(1, mapped(ip))],
        }
    }

    type Opened = Result<Arc<FakeDevice>, SelectError>;

    fn opener(count: &std::cell::Cell<u32>) -> impl FnOnce(&PortGids) -> Opened + '_ {
        move |port| {
            count.set(count.get() + 1);
            Ok(Arc::new(FakeDevice {
                route: Route::of(port),
                failed: AtomicBool::new(false),
            }))
        }
    }

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    /// Two NICs, mlx5_0 on 10.0.0.7 and mlx5_1 on 10.1.0.7: a control
    /// connection from each address goes through its NIC, each NIC's
    /// context is opened once, and an address on neither is refused with
    /// the address in the reason. (The old code chose mlx5_0 for the whole
    /// process and refused 10.1.0.7.)
    #[test]
    fn each_connection_goes_through_the_device_holding_its_local_address() {
        let ports = vec![
            nic("mlx5_0", 2, [10, 0, 0, 7]),
            nic("mlx5_1", 3, [10, 1, 0, 7]),
        ];
        let contexts = DeviceContexts::<FakeDevice>::new(ports, None).unwrap();
        let opens = std::cell::Cell::new(0);
        let via = |addr: &str| contexts.context_for(ip(addr), opener(&opens));
        let first = via("10.0.0.7").unwrap();
        let second = via("10.1.0.7").unwrap();
        assert_eq!(first.route.device, "mlx5_0");
        assert_eq!(second.route.device, "mlx5_1");
        assert!(Arc::ptr_eq(&via("10.1.0.7").unwrap(), &second));
        assert!(Arc::ptr_eq(&via("10.0.0.7").unwrap(), &first));
        assert_eq!(opens.get(), 2, "one context per device, not per session");
        let refused = via("192.168.9.9").unwrap_err();
        assert_eq!(
            refused,
            SelectError::NoDeviceForAddress {
                local: "192.168.9.9".parse().unwrap(),
                devices: "mlx5_0, mlx5_1".into()
            }
        );
        assert!(refused.to_string().contains("192.168.9.9"));
        // Loopback says nothing of the route: the default (first) device.
        assert!(Arc::ptr_eq(&via("127.0.0.1").unwrap(), &first));
        assert_eq!(contexts.opened().len(), 2);
        // A failed context is replaced on the next connection through it.
        first.failed.store(true, Ordering::Relaxed);
        let reopened = via("10.0.0.7").unwrap();
        assert!(!Arc::ptr_eq(&reopened, &first));
        assert_eq!(opens.get(), 3);
    }

    /// A named device wins: connections use it, and one whose address it
    /// does not hold is refused naming the device and the address.
    #[test]
    fn a_named_device_wins_and_refuses_addresses_it_does_not_hold() {
        let ports = vec![
            nic("mlx5_0", 2, [10, 0, 0, 7]),
            nic("mlx5_1", 3, [10, 1, 0, 7]),
        ];
        let contexts = DeviceContexts::<FakeDevice>::new(ports, Some("mlx5_1")).unwrap();
        let opens = std::cell::Cell::new(0);
        let via = |addr: &str| contexts.context_for(ip(addr), opener(&opens));
        assert_eq!(via("10.1.0.7").unwrap().route.device, "mlx5_1");
        assert_eq!(via("127.0.0.1").unwrap().route.device, "mlx5_1");
        assert_eq!(
            via("10.0.0.7").unwrap_err(),
            SelectError::NoGidForAddress {
                device: "mlx5_1".into(),
                local: "10.0.0.7".parse().unwrap()
            }
        );
        assert_eq!(opens.get(), 1);
    }
}
