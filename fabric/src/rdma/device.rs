//! Which device, port and GID the `rdma` transport uses. The choices are
//! pure functions over what discovery found, so they are tested without a
//! device; `verbs::context` feeds them the real lists.
//!
//! - Device: the one named by `--rdma-device` / `RDKV_RDMA_DEVICE`, else the
//!   first device (in rdma-core's order) with an active port.
//! - Port: the first active port of that device.
//! - GID (RoCE): an IPv4-mapped RoCE v2 GID first (routable over UDP/IP and
//!   what the rest of the network uses), then any other global RoCE v2 GID,
//!   then a link-local RoCE v2 one, then RoCE v1. InfiniBand: GID index 0
//!   (the port's default GID; IB routes by LID inside a subnet).

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
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SelectError {
    #[error("no RDMA device found")]
    NoDevices,
    #[error("RDMA device {wanted:?} not found (devices: {available})")]
    NoSuchDevice { wanted: String, available: String },
    #[error("no active port on {devices}")]
    NoActivePort { devices: String },
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
    let mut names: Vec<&str> = Vec::new();
    for p in ports {
        if !names.contains(&p.device.as_str()) {
            names.push(&p.device);
        }
    }
    let candidates: Vec<&PortCandidate> = match wanted.filter(|w| !w.is_empty()) {
        Some(wanted) => {
            let on_device: Vec<&PortCandidate> =
                ports.iter().filter(|p| p.device == wanted).collect();
            if on_device.is_empty() {
                return Err(SelectError::NoSuchDevice {
                    wanted: wanted.to_owned(),
                    available: names.join(", "),
                });
            }
            on_device
        }
        None => ports.iter().collect(),
    };
    candidates
        .iter()
        .find(|p| p.active)
        .copied()
        .ok_or_else(|| SelectError::NoActivePort {
            devices: match wanted.filter(|w| !w.is_empty()) {
                Some(w) => w.to_owned(),
                None => names.join(", "),
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
        }
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
