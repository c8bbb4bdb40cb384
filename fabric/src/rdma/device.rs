//! Which device, port and GID the `rdma` transport uses. The choices are
//! pure functions over what discovery found, so they are tested without a
//! device; `verbs::context` feeds them the real lists.
//!
//! - Device and port, per connection ([`port_for_local_address`]): the one
//!   named by `--rdma-device` / `RDKV_RDMA_DEVICE`, else the first active
//!   RoCE port whose GID table holds the control connection's local
//!   address, else an active InfiniBand port; when that address says
//!   nothing of the route (loopback), the first device (in rdma-core's
//!   order) with an active port ([`select_port`]). iWARP devices are never
//!   used: their queue pairs are set up through RDMA-CM and a READ target
//!   needs remote-write access, neither of which rdkv does.
//! - GID (RoCE): an IPv4-mapped RoCE v2 GID first (routable over UDP/IP and
//!   what the rest of the network uses), then any other global RoCE v2 GID,
//!   then a link-local RoCE v2 one, then RoCE v1. InfiniBand: GID index 0
//!   (the port's default GID; IB routes by LID inside a subnet).
//! - Per connection (RoCE): the GID whose address is the control
//!   connection's local address, on a netdev ([`gid_for_local_address`]):
//!   the route the kernel chose to the peer (secondary IP, VLAN, second
//!   NIC), so the queue pair sends from the interface the peer is reached
//!   through. No such GID on the device: the session is refused with the
//!   reason (before, it reached RTR and every request then failed).

use std::net::IpAddr;

use thiserror::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    InfiniBand,
    Ethernet,
    Unspecified,
}

/// One port of one device, as discovery reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortCandidate {
    pub device: String,
    /// Port number, from 1.
    pub port: u8,
    pub active: bool,
    pub link_layer: LinkLayer,
    /// The device speaks iWARP (never selected).
    pub iwarp: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SelectError {
    #[error("no RDMA device found")]
    NoDevices,
    #[error("RDMA device {wanted:?} not found (devices: {available})")]
    NoSuchDevice { wanted: String, available: String },
    #[error("no active port on {devices}")]
    NoActivePort { devices: String },
    #[error(
        "RDMA device {device:?} is iWARP, which rdkv does not support \
         (its queue pairs need RDMA-CM, its READ targets remote write)"
    )]
    IWarp { device: String },
    #[error(
        "no RoCE GID on {device} for the local address {local} (the route to the peer does not go through this device)"
    )]
    NoGidForAddress { device: String, local: IpAddr },
    #[error(
        "no RDMA device has a RoCE GID for the local address {local} (devices: {devices}; \
         the route to the peer goes through none of them)"
    )]
    NoDeviceForAddress { local: IpAddr, devices: String },
}

/// The port to use: on `wanted` if set, else on the first device that has
/// an active port.
pub fn select_port<'a>(
    ports: &'a [PortCandidate],
    wanted: Option<&str>,
) -> Result<&'a PortCandidate, SelectError> {
    if ports.is_empty() {
        return Err(SelectError::NoDevices);
    }
    let names = device_names(ports.iter().map(|p| p.device.as_str()));
    let candidates: Vec<&PortCandidate> = match wanted.filter(|w| !w.is_empty()) {
        Some(wanted) => {
            let on_device: Vec<&PortCandidate> =
                ports.iter().filter(|p| p.device == wanted).collect();
            if on_device.is_empty() {
                return Err(SelectError::NoSuchDevice {
                    wanted: wanted.to_owned(),
                    available: names,
                });
            }
            if on_device.iter().any(|p| p.iwarp) {
                return Err(SelectError::IWarp {
                    device: wanted.to_owned(),
                });
            }
            on_device
        }
        None => ports.iter().filter(|p| !p.iwarp).collect(),
    };
    candidates
        .iter()
        .find(|p| p.active)
        .copied()
        .ok_or_else(|| SelectError::NoActivePort {
            devices: match wanted.filter(|w| !w.is_empty()) {
                Some(w) => w.to_owned(),
                None => names,
            },
        })
}

/// One entry of a port's GID table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidCandidate {
    pub index: u8,
    pub gid: [u8; 16],
    /// RoCE v2 (UDP/IP encapsulation); false for RoCE v1 and InfiniBand.
    pub roce_v2: bool,
    /// The interface index of the GID's netdev (0: none; RoCE GIDs always
    /// have one, an entry without is not usable for RoCE).
    pub netdev: u32,
}

fn is_zero(gid: &[u8; 16]) -> bool {
    gid.iter().all(|&b| b == 0)
}

/// `::ffff:a.b.c.d`: a RoCE v2 GID derived from an interface's IPv4 address.
pub fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

fn is_link_local(gid: &[u8; 16]) -> bool {
    gid[0] == 0xfe && gid[1] & 0xc0 == 0x80
}

/// The GID index to use on a port with this link layer, if any is usable.
pub fn select_gid(link_layer: LinkLayer, gids: &[GidCandidate]) -> Option<u8> {
    let usable = || gids.iter().filter(|g| !is_zero(&g.gid));
    if link_layer == LinkLayer::InfiniBand {
        return usable().find(|g| g.index == 0).map(|g| g.index);
    }
    let rank = |g: &GidCandidate| match (g.roce_v2, is_ipv4_mapped(&g.gid), is_link_local(&g.gid)) {
        (true, true, _) => 0,
        (true, false, false) => 1,
        (true, false, true) => 2,
        (false, _, _) => 3,
    };
    // Lowest rank, then lowest index: stable across restarts.
    usable().min_by_key(|g| (rank(g), g.index)).map(|g| g.index)
}

/// The GID as the address it carries: IPv4-mapped for an IPv4 address.
fn gid_of_address(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The GID index a connection whose control socket's local address is
/// `local` uses. InfiniBand, or an address that says nothing of the route
/// (loopback, unspecified: a test on one host), keeps the port's default
/// (`default_index`). On RoCE, the GID equal to `local` on a netdev, RoCE
/// v2 before v1; none is an error, the session is refused.
pub fn gid_for_local_address(
    device: &str,
    link_layer: LinkLayer,
    gids: &[GidCandidate],
    default_index: u8,
    local: Option<IpAddr>,
) -> Result<u8, SelectError> {
    let local = match local {
        Some(ip)
            if link_layer != LinkLayer::InfiniBand && !ip.is_loopback() && !ip.is_unspecified() =>
        {
            ip
        }
        _ => return Ok(default_index),
    };
    let wanted = gid_of_address(local);
    gids.iter()
        .filter(|g| g.gid == wanted && g.netdev != 0)
        .min_by_key(|g| (!g.roce_v2, g.index))
        .map(|g| g.index)
        .ok_or_else(|| SelectError::NoGidForAddress {
            device: device.to_owned(),
            local,
        })
}

/// One port and its GID table, as discovery reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortGids {
    pub port: PortCandidate,
    pub gids: Vec<GidCandidate>,
}

/// Whether `local` says anything of the route (a single-host test's
/// loopback or an unknown address does not).
fn routable(local: Option<IpAddr>) -> Option<IpAddr> {
    local.filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
}

/// The port (an index into `ports`) a connection whose control socket's
/// local address is `local` goes through:
/// - a named device (`wanted`) wins; the GID check then runs per
///   connection ([`gid_for_local_address`]) and refuses naming the device;
/// - an address that says nothing of the route: the default port
///   ([`select_port`]);
/// - else the first active RoCE port (iWARP never) whose GID table holds
///   the address on a netdev (the same test as [`gid_for_local_address`]);
///   none: an active InfiniBand port if there is one (IB GIDs carry no IP
///   address; IPoIB's route says nothing here), else refused, naming the
///   address.
pub fn port_for_local_address(
    ports: &[PortGids],
    wanted: Option<&str>,
    local: Option<IpAddr>,
) -> Result<usize, SelectError> {
    let named = wanted.filter(|w| !w.is_empty());
    let (Some(local), None) = (routable(local), named) else {
        let candidates: Vec<PortCandidate> = ports.iter().map(|p| p.port.clone()).collect();
        let chosen = select_port(&candidates, named)?;
        let index = candidates
            .iter()
            .position(|p| p == chosen)
            .ok_or(SelectError::NoDevices)?;
        let port = &ports[index];
        // The named device must hold the address too (the default index is
        // not used: only the refusal matters here).
        gid_for_local_address(&chosen.device, chosen.link_layer, &port.gids, 0, local)?;
        return Ok(index);
    };
    let usable = |p: &PortGids| p.port.active && !p.port.iwarp;
    let holds = |p: &PortGids| {
        p.port.link_layer != LinkLayer::InfiniBand
            && gid_for_local_address(&p.port.device, p.port.link_layer, &p.gids, 0, Some(local))
                .is_ok()
    };
    let infiniband = |p: &PortGids| p.port.link_layer == LinkLayer::InfiniBand;
    ports
        .iter()
        .position(|p| usable(p) && holds(p))
        .or_else(|| ports.iter().position(|p| usable(p) && infiniband(p)))
        .ok_or_else(|| SelectError::NoDeviceForAddress {
            local,
            devices: device_names(ports.iter().map(|p| p.port.device.as_str())),
        })
}

/// The devices' names, each once, in discovery order.
fn device_names<'a>(devices: impl Iterator<Item = &'a str>) -> String {
    let mut names: Vec<&str> = Vec::new();
    for device in devices {
        if !names.contains(&device) {
            names.push(device);
        }
    }
    names.join(", ")
}

/// The path MTU of a connection: the smaller of both ports' active MTUs.
pub fn path_mtu_bytes(local_bytes: u16, remote_bytes: u16) -> u16 {
    local_bytes.min(remote_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(device: &str, port: u8, active: bool) -> PortCandidate {
        PortCandidate {
            device: device.into(),
            port,
            active,
            link_layer: LinkLayer::Ethernet,
            iwarp: false,
        }
    }

    #[test]
    fn iwarp_devices_are_never_chosen() {
        let iwarp = PortCandidate {
            iwarp: true,
            ..port("iw_cxgb4", 1, true)
        };
        let ports = [iwarp.clone(), port("rxe0", 1, true)];
        assert_eq!(select_port(&ports, None).unwrap().device, "rxe0");
        assert_eq!(
            select_port(&ports, Some("iw_cxgb4")),
            Err(SelectError::IWarp {
                device: "iw_cxgb4".into()
            })
        );
        assert_eq!(
            select_port(&[iwarp], None),
            Err(SelectError::NoActivePort {
                devices: "iw_cxgb4".into()
            })
        );
    }

    fn mapped(a: u8, b: u8, c: u8, d: u8) -> [u8; 16] {
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d]
    }

    /// A port with eth0 (10.0.0.7, and a secondary 10.0.0.8) and a VLAN
    /// netdev (10.1.0.7): the GID is the one of the control socket's local
    /// address, whatever the lowest IPv4-mapped GID is.
    #[test]
    fn the_gid_follows_the_control_sockets_local_address() {
        let on = |netdev: u32, candidate: GidCandidate| GidCandidate {
            netdev,
            ..candidate
        };
        let link_local = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        let table = [
            on(2, gid(0, link_local, false)),
            on(2, gid(2, mapped(10, 0, 0, 7), false)),
            on(2, gid(3, mapped(10, 0, 0, 7), true)),
            on(2, gid(4, mapped(10, 0, 0, 8), true)),
            on(7, gid(5, mapped(10, 1, 0, 7), true)),
            // No netdev: not a usable RoCE GID.
            gid(6, mapped(10, 2, 0, 7), true),
        ];
        let default = select_gid(LinkLayer::Ethernet, &table).unwrap();
        assert_eq!(default, 3);
        let at = |ip: &str| {
            gid_for_local_address(
                "mlx5_0",
                LinkLayer::Ethernet,
                &table,
                default,
                Some(ip.parse().unwrap()),
            )
        };
        assert_eq!(at("10.1.0.7"), Ok(5));
        assert_eq!(at("10.0.0.8"), Ok(4));
        assert_eq!(at("10.0.0.7"), Ok(3));
        assert_eq!(
            at("192.168.9.9"),
            Err(SelectError::NoGidForAddress {
                device: "mlx5_0".into(),
                local: "192.168.9.9".parse().unwrap()
            })
        );
        assert!(at("10.2.0.7").is_err());
        // Loopback (tests on one host) and unknown: the port's default.
        assert_eq!(at("127.0.0.1"), Ok(3));
        assert_eq!(
            gid_for_local_address("mlx5_0", LinkLayer::Ethernet, &table, default, None),
            Ok(3)
        );
        let ib = gid_for_local_address(
            "mlx5_0",
            LinkLayer::InfiniBand,
            &table,
            0,
            Some("10.1.0.7".parse().unwrap()),
        );
        assert_eq!(ib, Ok(0));
    }

    /// The port holding the address must be usable: an inactive or
    /// iWARP port holding it is skipped; with no RoCE port holding it, an
    /// InfiniBand port serves (its GIDs carry no IP address).
    #[test]
    fn the_route_skips_unusable_ports_and_falls_back_to_infiniband() {
        let holding = |device: &str, active: bool, iwarp: bool| PortGids {
            port: PortCandidate {
                iwarp,
                ..port(device, 1, active)
            },
            gids: vec![GidCandidate {
                netdev: 4,
                ..gid(1, mapped(10, 0, 0, 7), true)
            }],
        };
        let local = Some("10.0.0.7".parse().unwrap());
        let ports = [
            holding("down0", false, false),
            holding("iw0", true, true),
            holding("rxe0", true, false),
        ];
        assert_eq!(port_for_local_address(&ports, None, local), Ok(2));
        let ib = PortGids {
            port: PortCandidate {
                link_layer: LinkLayer::InfiniBand,
                ..port("mlx4_0", 1, true)
            },
            gids: vec![gid(
                0,
                [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
                false,
            )],
        };
        let no_roce = [ports[0].clone(), ports[1].clone(), ib];
        assert_eq!(port_for_local_address(&no_roce, None, local), Ok(2));
        assert_eq!(
            port_for_local_address(&no_roce[..2], None, local),
            Err(SelectError::NoDeviceForAddress {
                local: "10.0.0.7".parse().unwrap(),
                devices: "down0, iw0".into()
            })
        );
    }

    #[test]
    fn the_first_active_port_wins_unless_a_device_is_named() {
        let ports = [
            port("mlx5_0", 1, false),
            port("mlx5_0", 2, false),
            port("mlx5_1", 1, true),
            port("rxe0", 1, true),
        ];
        assert_eq!(select_port(&ports, None).unwrap().device, "mlx5_1");
        assert_eq!(select_port(&ports, Some("")).unwrap().device, "mlx5_1");
        assert_eq!(select_port(&ports, Some("rxe0")).unwrap().device, "rxe0");
        assert_eq!(
            select_port(&ports, Some("mlx5_0")),
            Err(SelectError::NoActivePort {
                devices: "mlx5_0".into()
            })
        );
        assert_eq!(
            select_port(&ports, Some("mlx4_0")),
            Err(SelectError::NoSuchDevice {
                wanted: "mlx4_0".into(),
                available: "mlx5_0, mlx5_1, rxe0".into()
            })
        );
        assert_eq!(select_port(&[], None), Err(SelectError::NoDevices));
        let down = [port("mlx5_0", 1, false), port("rxe0", 1, false)];
        assert_eq!(
            select_port(&down, None),
            Err(SelectError::NoActivePort {
                devices: "mlx5_0, rxe0".into()
            })
        );
        let second_port = [port("mlx5_0", 1, false), port("mlx5_0", 2, true)];
        assert_eq!(select_port(&second_port, None).unwrap().port, 2);
    }

    fn gid(index: u8, bytes: [u8; 16], roce_v2: bool) -> GidCandidate {
        GidCandidate {
            index,
            gid: bytes,
            roce_v2,
            netdev: 0,
        }
    }

    #[test]
    fn roce_prefers_an_ipv4_mapped_v2_gid() {
        let link_local = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        let v4 = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 1, 5];
        let global6 = [0x20, 0x01, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let table = [
            gid(0, link_local, false),
            gid(1, link_local, true),
            gid(2, v4, false),
            gid(3, v4, true),
            gid(4, global6, true),
        ];
        assert_eq!(select_gid(LinkLayer::Ethernet, &table), Some(3));
        assert_eq!(select_gid(LinkLayer::Ethernet, &table[..3]), Some(1));
        assert_eq!(
            select_gid(LinkLayer::Ethernet, &[table[0], table[1], table[4]]),
            Some(4)
        );
        assert_eq!(select_gid(LinkLayer::Ethernet, &table[..1]), Some(0));
        assert_eq!(
            select_gid(LinkLayer::Ethernet, &[gid(0, [0; 16], true)]),
            None
        );
        assert_eq!(select_gid(LinkLayer::Ethernet, &[]), None);
        assert!(is_ipv4_mapped(&v4) && !is_ipv4_mapped(&global6));
    }

    #[test]
    fn infiniband_uses_gid_zero() {
        let default_gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 2, 0xc9, 3, 0, 1, 2, 3];
        let table = [gid(0, default_gid, false), gid(1, default_gid, false)];
        assert_eq!(select_gid(LinkLayer::InfiniBand, &table), Some(0));
        assert_eq!(select_gid(LinkLayer::InfiniBand, &table[1..]), None);
        assert_eq!(path_mtu_bytes(4096, 1024), 1024);
    }
}
