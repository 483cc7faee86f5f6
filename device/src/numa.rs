//! Where a GPU sits on a machine with several NUMA nodes: its node (from the PCI device's
//! `numa_node` in sysfs) and that node's CPUs, so that the threads that stage bytes for it, and
//! the pinned staging buffers they fill, are on its side of the machine. On a machine with one
//! node (or where the firmware does not say, `numa_node` = -1) there is nothing to choose.

use std::path::Path;

/// The NUMA node of the PCI device `bus_id` (`"0000:3b:00.0"`, any case), if the machine has
/// more than one node and sysfs names it.
pub fn node_of_pci(bus_id: &str) -> Option<u32> {
    node_of_pci_in(Path::new("/sys"), bus_id)
}

/// The CPUs of NUMA node `node`, from sysfs.
pub fn cpus_of(node: u32) -> Option<Vec<usize>> {
    cpus_of_in(Path::new("/sys"), node)
}

/// Binds the calling thread to `cpus` (`sched_setaffinity`); new threads it starts inherit it.
pub fn pin_current_thread(cpus: &[usize]) -> std::io::Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    for &c in cpus {
        if c < rustix::thread::CpuSet::MAX_CPU {
            set.set(c);
        }
    }
    rustix::thread::sched_setaffinity(None, &set).map_err(std::io::Error::from)
}

fn node_of_pci_in(sys: &Path, bus_id: &str) -> Option<u32> {
    let nodes = std::fs::read_dir(sys.join("devices/system/node"))
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.strip_prefix("node")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .count();
    if nodes < 2 {
        return None;
    }
    let bus = bus_id.to_ascii_lowercase();
    let text =
        std::fs::read_to_string(sys.join("bus/pci/devices").join(&bus).join("numa_node")).ok()?;
    text.trim()
        .parse::<i64>()
        .ok()
        .and_then(|n| u32::try_from(n).ok())
}

fn cpus_of_in(sys: &Path, node: u32) -> Option<Vec<usize>> {
    let text = std::fs::read_to_string(sys.join(format!("devices/system/node/node{node}/cpulist")))
        .ok()?;
    parse_cpulist(text.trim())
}

/// `"0-3,8,10-11"` → `[0, 1, 2, 3, 8, 10, 11]`; `None` if malformed or empty.
pub fn parse_cpulist(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    (!cpus.is_empty()).then_some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists_parse() {
        assert_eq!(
            parse_cpulist("0-3,8,10-11"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpulist("5"), Some(vec![5]));
        assert_eq!(parse_cpulist(""), None);
        assert_eq!(parse_cpulist("3-1"), None);
        assert_eq!(parse_cpulist("a"), None);
    }

    /// A fake sysfs: two nodes, the GPU on node 1.
    #[test]
    fn a_gpu_on_the_second_node_of_two() {
        let sys = tempfile::tempdir().unwrap();
        let p = sys.path();
        for (n, cpus) in [(0, "0-7"), (1, "8-15")] {
            let d = p.join(format!("devices/system/node/node{n}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cpulist"), format!("{cpus}\n")).unwrap();
        }
        std::fs::create_dir_all(p.join("devices/system/node/possible_dir_not_a_node")).unwrap();
        let dev = p.join("bus/pci/devices/0000:3b:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("numa_node"), "1\n").unwrap();
        assert_eq!(node_of_pci_in(p, "0000:3B:00.0"), Some(1));
        assert_eq!(cpus_of_in(p, 1), Some((8..16).collect()));
        std::fs::write(dev.join("numa_node"), "-1\n").unwrap();
        assert_eq!(
            node_of_pci_in(p, "0000:3b:00.0"),
            None,
            "firmware does not say"
        );
        std::fs::remove_dir_all(p.join("devices/system/node/node1")).unwrap();
        std::fs::write(dev.join("numa_node"), "0\n").unwrap();
        assert_eq!(
            node_of_pci_in(p, "0000:3b:00.0"),
            None,
            "one node: nothing to choose"
        );
    }
}
