//! The read paths through a staged writer (as CUDA's, with page-aligned buffers) over a
//! test backend that keeps the arena in a `Vec`: every byte lands where the layout says,
//! warm or cold, whatever the chunk and page boundaries.

use std::sync::{Arc, Mutex};

use modelshare_device::{
    Arena, Backend, BackendKind, DeviceError, DeviceInfo, DeviceThread, Export,
};

use super::*;
use crate::registry::{LoadProgress, Reservation};
use crate::weights::WeightLimits;

/// Small buffers, so that tensors span several chunks.
const BUF: usize = 16 * PAGE;

/// The writers alive, counted (a failed load must drop them all).
#[derive(Debug, Default, Clone)]
struct Live(Arc<std::sync::atomic::AtomicUsize>);

impl Live {
    fn now(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

#[derive(Debug)]
struct StagedBackend(Live);

#[derive(Debug)]
struct VecArena(Arc<Mutex<Vec<u8>>>, Live);

struct StagedWriter {
    live: Live,
    mem: Arc<Mutex<Vec<u8>>>,
    raw: Vec<u8>,
    at: usize,
    offset: Option<u64>,
}

impl Backend for StagedBackend {
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            backend: BackendKind::Host,
            uuid: "staged-test".into(),
            name: "staged test backend".into(),
            total_bytes: 0,
            numa_node: None,
        }
    }
    fn allocate(&mut self, len: u64, _: &str) -> modelshare_device::Result<Box<dyn Arena>> {
        Ok(Box::new(VecArena(
            Arc::new(Mutex::new(vec![0; len as usize])),
            self.0.clone(),
        )))
    }
    fn used_bytes(&mut self) -> Option<u64> {
        None
    }
}

impl Arena for VecArena {
    fn len(&self) -> u64 {
        self.0.lock().unwrap().len() as u64
    }
    fn write_at(&self, offset: u64, bytes: &[u8]) -> modelshare_device::Result<()> {
        let o = offset as usize;
        self.0.lock().unwrap()[o..o + bytes.len()].copy_from_slice(bytes);
        Ok(())
    }
    fn seal(&self) -> modelshare_device::Result<()> {
        Ok(())
    }
    fn export(&self) -> modelshare_device::Result<Export> {
        Err(DeviceError::Unsupported {
            what: "export".into(),
        })
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> modelshare_device::Result<()> {
        let o = offset as usize;
        buf.copy_from_slice(&self.0.lock().unwrap()[o..o + buf.len()]);
        Ok(())
    }
    fn writer(&self, _: &ArenaHandle) -> modelshare_device::Result<Box<dyn ArenaWriter + Send>> {
        let raw = vec![0u8; BUF + PAGE];
        let at = raw.as_ptr().align_offset(PAGE);
        self.1.0.fetch_add(1, Ordering::SeqCst);
        Ok(Box::new(StagedWriter {
            live: self.1.clone(),
            mem: self.0.clone(),
            raw,
            at,
            offset: None,
        }))
    }
}

impl Drop for StagedWriter {
    fn drop(&mut self) {
        self.live.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl ArenaWriter for StagedWriter {
    fn staged(&self) -> bool {
        true
    }
    fn buffer(&mut self, offset: u64) -> modelshare_device::Result<&mut [u8]> {
        self.offset = Some(offset);
        Ok(&mut self.raw[self.at..self.at + BUF])
    }
    fn submit(&mut self, skip: usize, len: usize) -> modelshare_device::Result<()> {
        let o = self.offset.take().unwrap() as usize;
        let from = self.at + skip;
        self.mem.lock().unwrap()[o..o + len].copy_from_slice(&self.raw[from..from + len]);
        Ok(())
    }
    fn finish(self: Box<Self>) -> modelshare_device::Result<()> {
        Ok(())
    }
}

fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A model of tensors of odd sizes (they start at unaligned file offsets and end mid-page),
/// validated and planned.
struct Fixture {
    _dir: tempfile::TempDir,
    datas: Vec<Vec<u8>>,
    source: ModelSource,
    layout: Layout,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let sizes = [5 * BUF + 3, BUF, 7, 3 * PAGE + 1001];
    let datas: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, n)| random(*n, i as u64 + 7))
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = datas
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let t = safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![d.len()], d)
                .unwrap();
            (format!("t{i}"), t)
        })
        .collect();
    safetensors::serialize_to_file(views, &None, &dir.path().join("model.safetensors")).unwrap();
    let source =
        crate::weights::source::resolve(dir.path(), "model.safetensors", &WeightLimits::default())
            .unwrap();
    let layout = crate::weights::layout::plan(&source).unwrap();
    Fixture {
        _dir: dir,
        datas,
        source,
        layout,
    }
}

fn job(f: &Fixture) -> Reservation {
    Reservation {
        model: "m".into(),
        version: 1,
        generation: 1,
        progress: Arc::new(LoadProgress {
            done: AtomicU64::new(0),
            total: f.layout.payload_bytes,
            cancel: AtomicBool::new(false),
        }),
        manifest: manifest("m", &f.source, &f.layout),
        device: "staged-test".into(),
    }
}

fn device(live: &Live) -> DeviceThread {
    let live = live.clone();
    DeviceThread::start("staged-test", move || {
        Ok(Box::new(StagedBackend(live)) as Box<dyn Backend>)
    })
    .unwrap()
}

fn copy(f: &Fixture, job: &Reservation, arena: &ArenaHandle) -> Result<Copied, CoreError> {
    copy_into(
        job,
        arena,
        &f.source,
        &f.layout,
        &CopyOptions {
            threads: 3,
            cpu_hash: false,
            gate: &ChunkGate::new(2),
            cpus: None,
        },
    )
}

#[test]
fn staged_loads_place_every_byte_warm_and_cold() {
    let f = fixture();
    let live = Live::default();
    let device = device(&live);
    for cold in [false, true] {
        let file = &f.source.shards[0].file;
        if cold {
            file.sync_all().unwrap();
            rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::DontNeed).unwrap();
        }
        let evicted = !pagecache::resident(file, 0, f.source.shards[0].file_len as usize).unwrap();
        let job = job(&f);
        let arena = device.allocate(f.layout.arena_bytes, "m@1").wait().unwrap();
        let copied = copy(&f, &job, &arena).unwrap();
        assert_eq!(
            copied.page_cache_bytes + copied.direct_bytes,
            f.layout.payload_bytes
        );
        if cold && evicted && pagecache::open_direct(file).is_ok() {
            assert!(
                copied.direct_bytes > 0,
                "a cold file is read with direct I/O"
            );
        }
        if !cold {
            assert_eq!(
                copied.direct_bytes, 0,
                "a cached file goes through the cache"
            );
        }
        for (t, meta) in f.layout.tensors.iter().zip(&copied.manifest.tensors) {
            let i: usize = t.name[1..].parse().unwrap();
            let back = arena
                .read_at(t.arena_offset, t.byte_length as usize)
                .wait()
                .unwrap();
            assert!(back == f.datas[i], "tensor {} (cold: {cold})", t.name);
            assert_eq!(meta.xxh3, xxhash_rust::xxh3::xxh3_64(&f.datas[i]));
        }
        assert_eq!(live.now(), 0, "every writer dropped");
    }
}

/// An unload of a loading version sets its cancel flag: the copy stops with `LoadCancelled`
/// and every writer (on CUDA: its staging buffers and stream) is dropped.
#[test]
fn a_cancelled_load_stops_and_drops_every_writer() {
    let f = fixture();
    let live = Live::default();
    let device = device(&live);
    let job = job(&f);
    job.progress.cancel.store(true, Ordering::SeqCst);
    let arena = device.allocate(f.layout.arena_bytes, "m@1").wait().unwrap();
    let e = copy(&f, &job, &arena).unwrap_err();
    assert!(matches!(e, CoreError::LoadCancelled { .. }), "{e}");
    assert_eq!(live.now(), 0);
}

/// A weights file cut short after it was validated: the load fails naming the file, the
/// tensor and the byte, and every writer is dropped.
#[test]
fn a_file_cut_short_fails_the_load_naming_it() {
    let f = fixture();
    let live = Live::default();
    let device = device(&live);
    let shard = &f.source.shards[0];
    shard
        .file
        .set_len(shard.file_len - 2 * PAGE as u64)
        .unwrap_or_else(|_| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(f._dir.path().join("model.safetensors"))
                .unwrap()
                .set_len(shard.file_len - 2 * PAGE as u64)
                .unwrap()
        });
    let job = job(&f);
    let arena = device.allocate(f.layout.arena_bytes, "m@1").wait().unwrap();
    let e = copy(&f, &job, &arena).unwrap_err().to_string();
    assert!(
        e.contains("model.safetensors") && e.contains("reading tensor"),
        "{e}"
    );
    assert_eq!(live.now(), 0);
}
