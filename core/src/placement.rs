//! Where a model version goes when the server has several devices: pure decisions over a
//! snapshot of the devices, no device call and no lock (the caller gathers the figures).
//!
//! A load names its devices (by UUID, or by their place in the server's list; `all`: every
//! one), or asks for `replicas` and gets the least-used devices: fewest bytes of this server's arenas first,
//! then most free memory, then the server's order. A device is a candidate only where the
//! arena fits under its `max_device_bytes` and in its free memory.

use crate::error::CoreError;

/// What a load asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wanted {
    /// Devices by UUID or by index in the server's list (empty: the server picks).
    pub devices: Vec<String>,
    /// How many devices, when none are named (0: one).
    pub replicas: u32,
}

/// One device as placement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The device's UUID.
    pub uuid: String,
    /// Bytes of this server's arenas on it (loading, ready, draining).
    pub held_bytes: u64,
    /// Free memory the device reports (`None`: unknown).
    pub free_bytes: Option<u64>,
    /// The operator's cap on arena bytes per device (`max_device_bytes`).
    pub limit: Option<u64>,
}

impl Candidate {
    /// Why an arena of `need` bytes does not fit here, or `None` when it does.
    fn refusal(&self, need: u64) -> Option<String> {
        if let Some(limit) = self.limit
            && self.held_bytes.saturating_add(need) > limit
        {
            return Some(format!(
                "{}: {} bytes held + {need} > max_device_bytes {limit}",
                self.uuid, self.held_bytes
            ));
        }
        if let Some(free) = self.free_bytes
            && need > free
        {
            return Some(format!("{}: {need} bytes > {free} free", self.uuid));
        }
        None
    }
}

/// The devices (UUIDs) an arena of `need` bytes goes to, first the one loaded from the file.
/// `devices` is the server's list in order.
pub fn place(wanted: &Wanted, devices: &[Candidate], need: u64) -> Result<Vec<String>, CoreError> {
    let names = || {
        devices
            .iter()
            .enumerate()
            .map(|(i, d)| format!("{i}={}", d.uuid))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let [all] = wanted.devices.as_slice()
        && all.eq_ignore_ascii_case("all")
    {
        if wanted.replicas != 0 && wanted.replicas as usize != devices.len() {
            return Err(CoreError::InvalidArgument {
                field: "replicas".into(),
                reason: format!(
                    "{} replicas asked for with devices 'all', and this server has {} ({}): \
                     give one of the two",
                    wanted.replicas,
                    devices.len(),
                    names()
                ),
            });
        }
        let every = Wanted {
            devices: devices.iter().map(|d| d.uuid.clone()).collect(),
            replicas: 0,
        };
        return place(&every, devices, need);
    }
    if !wanted.devices.is_empty() {
        if wanted.replicas != 0 && wanted.replicas as usize != wanted.devices.len() {
            return Err(CoreError::InvalidArgument {
                field: "replicas".into(),
                reason: format!(
                    "{} replicas asked for with {} devices named: name the devices or give \
                     replicas, or make them agree",
                    wanted.replicas,
                    wanted.devices.len()
                ),
            });
        }
        let mut chosen: Vec<&Candidate> = Vec::with_capacity(wanted.devices.len());
        for name in &wanted.devices {
            let found = find(devices, name).ok_or_else(|| CoreError::InvalidArgument {
                field: "devices".into(),
                reason: format!("no device '{name}' on this server (devices: {})", names()),
            })?;
            if chosen.iter().any(|c| c.uuid == found.uuid) {
                return Err(CoreError::InvalidArgument {
                    field: "devices".into(),
                    reason: format!("device {} is named twice", found.uuid),
                });
            }
            if let Some(why) = found.refusal(need) {
                return Err(CoreError::NoDeviceRoom(why));
            }
            chosen.push(found);
        }
        return Ok(chosen.into_iter().map(|c| c.uuid.clone()).collect());
    }
    let n = wanted.replicas.max(1) as usize;
    if n > devices.len() {
        return Err(CoreError::InvalidArgument {
            field: "replicas".into(),
            reason: format!(
                "{n} replicas asked for, and this server has {} device(s) ({}); one replica per \
                 device at most",
                devices.len(),
                names()
            ),
        });
    }
    let mut fitting: Vec<(usize, &Candidate)> = Vec::new();
    let mut refusals = Vec::new();
    for (i, d) in devices.iter().enumerate() {
        match d.refusal(need) {
            None => fitting.push((i, d)),
            Some(why) => refusals.push(why),
        }
    }
    if fitting.len() < n {
        return Err(CoreError::NoDeviceRoom(format!(
            "{n} device(s) with room for {need} bytes wanted, {} found ({})",
            fitting.len(),
            refusals.join("; ")
        )));
    }
    fitting.sort_by_key(|(i, d)| (d.held_bytes, std::cmp::Reverse(d.free_bytes), *i));
    Ok(fitting
        .into_iter()
        .take(n)
        .map(|(_, d)| d.uuid.clone())
        .collect())
}

/// The candidate a name means: its UUID (any case), or its index in the server's list.
fn find<'a>(devices: &'a [Candidate], name: &str) -> Option<&'a Candidate> {
    devices
        .iter()
        .find(|d| d.uuid.eq_ignore_ascii_case(name))
        .or_else(|| devices.get(name.parse::<usize>().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(uuid: &str, held: u64, free: Option<u64>) -> Candidate {
        Candidate {
            uuid: uuid.into(),
            held_bytes: held,
            free_bytes: free,
            limit: None,
        }
    }

    fn three() -> Vec<Candidate> {
        vec![
            dev("GPU-a", 500, Some(1_000)),
            dev("GPU-b", 100, Some(1_000)),
            dev("GPU-c", 100, Some(2_000)),
        ]
    }

    fn want(devices: &[&str], replicas: u32) -> Wanted {
        Wanted {
            devices: devices.iter().map(|s| s.to_string()).collect(),
            replicas,
        }
    }

    /// By default one device: the one holding least, then the one with most free memory.
    #[test]
    fn one_replica_goes_to_the_least_used_device() {
        assert_eq!(place(&Wanted::default(), &three(), 10).unwrap(), ["GPU-c"]);
        assert_eq!(
            place(&want(&[], 2), &three(), 10).unwrap(),
            ["GPU-c", "GPU-b"]
        );
        assert_eq!(
            place(&want(&[], 3), &three(), 10).unwrap(),
            ["GPU-c", "GPU-b", "GPU-a"]
        );
    }

    /// Ties keep the server's order (a fresh server fills device 0 first).
    #[test]
    fn ties_keep_the_servers_order() {
        let d = vec![dev("x", 0, None), dev("y", 0, None)];
        assert_eq!(place(&Wanted::default(), &d, 1).unwrap(), ["x"]);
    }

    /// Named devices are taken as named, by UUID in any case or by index, in that order.
    #[test]
    fn named_devices_by_uuid_or_index() {
        assert_eq!(
            place(&want(&["gpu-A", "2"], 0), &three(), 10).unwrap(),
            ["GPU-a", "GPU-c"]
        );
        assert_eq!(place(&want(&["1"], 1), &three(), 10).unwrap(), ["GPU-b"]);
    }

    /// `all` is every device, in the server's order, each needing room.
    #[test]
    fn all_means_every_device() {
        assert_eq!(
            place(&want(&["ALL"], 0), &three(), 10).unwrap(),
            ["GPU-a", "GPU-b", "GPU-c"]
        );
        let e = place(&want(&["all"], 0), &three(), 1_500).unwrap_err();
        assert!(matches!(e, CoreError::NoDeviceRoom(_)), "{e}");
        // With as many replicas as devices, the same; with another count, which one was meant?
        assert_eq!(place(&want(&["all"], 3), &three(), 10).unwrap().len(), 3);
        let e = place(&want(&["all"], 2), &three(), 10).unwrap_err();
        assert!(matches!(e, CoreError::InvalidArgument { .. }), "{e}");
        assert!(e.to_string().contains("0=GPU-a, 1=GPU-b, 2=GPU-c"), "{e}");
    }

    /// Bad requests are refused with the server's devices named, never half-placed.
    #[test]
    fn refusals_name_the_devices_and_the_reason() {
        let e = place(&want(&["GPU-z"], 0), &three(), 10).unwrap_err();
        assert!(matches!(e, CoreError::InvalidArgument { .. }));
        assert!(e.to_string().contains("0=GPU-a, 1=GPU-b, 2=GPU-c"), "{e}");
        let e = place(&want(&["0", "GPU-a"], 0), &three(), 10).unwrap_err();
        assert!(e.to_string().contains("named twice"), "{e}");
        let e = place(&want(&[], 4), &three(), 10).unwrap_err();
        assert!(e.to_string().contains("3 device(s)"), "{e}");
        let e = place(&want(&["0"], 2), &three(), 10).unwrap_err();
        assert!(e.to_string().contains("2 replicas"), "{e}");
    }

    /// A device without room (free memory, or its cap) is skipped when the server picks and
    /// refused when named.
    #[test]
    fn room_decides() {
        let mut d = three();
        d[2].limit = Some(150);
        // c holds 100 under a cap of 150: 100 more do not fit; b is next.
        assert_eq!(place(&Wanted::default(), &d, 100).unwrap(), ["GPU-b"]);
        let e = place(&want(&["GPU-c"], 0), &d, 100).unwrap_err();
        assert!(matches!(e, CoreError::NoDeviceRoom(_)), "{e}");
        assert!(e.to_string().contains("max_device_bytes 150"), "{e}");
        // 1500 bytes fit only on c's free memory, and c's cap refuses: none fits.
        d[2].limit = None;
        assert_eq!(place(&Wanted::default(), &d, 1_500).unwrap(), ["GPU-c"]);
        let e = place(&want(&[], 2), &d, 1_500).unwrap_err();
        assert!(e.to_string().contains("1 found"), "{e}");
    }
}
