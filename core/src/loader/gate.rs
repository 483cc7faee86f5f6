//! How loads share the machine: at most `cap` chunks are being read and staged at once, over
//! every load of the server, handed out in the order asked for (first come, first served).
//!
//! A load is CPU- and memory-bandwidth-bound (a copy out of the page cache per byte), so two
//! loads each running all their threads at once only oversubscribe the cores and thrash the
//! cache their staging buffers live in. Through the gate their threads take turns chunk by
//! chunk, and each load keeps only its share of threads ([`ChunkGate::over_share`], asked
//! between tensors: with two loads, half each), so the staging buffers in use stay as few as
//! for one load: two loads running together get about half the bandwidth each and finish in
//! about the time of the same bytes loaded as one.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::thread::Thread;

/// The gate (see the module docs). Shared by the loads of one server.
#[derive(Debug)]
pub struct ChunkGate {
    cap: usize,
    state: Mutex<State>,
    /// Loads copying now.
    loads: std::sync::atomic::AtomicUsize,
}

/// A load's registration with the gate, for as long as it copies.
#[derive(Debug)]
pub struct Running<'a>(&'a ChunkGate);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0
            .loads
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[derive(Debug, Default)]
struct State {
    in_use: usize,
    /// Threads waiting for a slot, in arrival order, by ticket.
    waiting: VecDeque<(u64, Thread)>,
    next_ticket: u64,
}

/// A slot: held while one chunk is read and submitted; the next waiter gets it on drop.
#[derive(Debug)]
pub struct Slot<'a>(&'a ChunkGate);

impl ChunkGate {
    /// A gate letting `cap` chunks through at once (at least 1).
    pub fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            state: Mutex::new(State::default()),
            loads: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Registers a load for as long as the returned value lives.
    pub fn start(&self) -> Running<'_> {
        self.loads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Running(self)
    }

    /// Whether a load running `threads` threads has more than its share (the gate's slots
    /// over the loads running, at least one): then one of them should stop (between tensors;
    /// the others take its work).
    pub fn over_share(&self, threads: usize) -> bool {
        let loads = self.loads.load(std::sync::atomic::Ordering::SeqCst).max(1);
        threads > (self.cap / loads).max(1)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a slot, behind every thread that asked before.
    pub fn enter(&self) -> Slot<'_> {
        let mut s = self.lock();
        if s.in_use < self.cap && s.waiting.is_empty() {
            s.in_use += 1;
            return Slot(self);
        }
        let ticket = s.next_ticket;
        s.next_ticket += 1;
        s.waiting.push_back((ticket, std::thread::current()));
        loop {
            drop(s);
            std::thread::park();
            s = self.lock();
            // A leaving slot's owner hands its slot over by taking the waiter off the queue.
            if !s.waiting.iter().any(|(t, _)| *t == ticket) {
                return Slot(self);
            }
        }
    }

    /// Chunks being read now.
    #[cfg(test)]
    fn in_use(&self) -> usize {
        self.lock().in_use
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        match s.waiting.pop_front() {
            // The slot passes to the first waiter (`in_use` unchanged).
            Some((_, thread)) => thread.unpark(),
            None => s.in_use -= 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[test]
    fn each_load_keeps_its_share_of_threads() {
        let gate = ChunkGate::new(12);
        let one = gate.start();
        assert!(!gate.over_share(12), "alone, a load keeps every slot");
        let two = gate.start();
        assert!(gate.over_share(12) && gate.over_share(7) && !gate.over_share(6));
        drop(one);
        assert!(!gate.over_share(12), "the other finished: all slots again");
        let _three = gate.start();
        let _four = gate.start();
        let _five = gate.start();
        drop(two);
        assert!(!gate.over_share(4) && gate.over_share(5));
        let many: Vec<_> = (0..20).map(|_| gate.start()).collect();
        assert!(!gate.over_share(1), "never fewer than one thread");
        drop(many);
    }

    #[test]
    fn never_more_than_cap_and_everyone_gets_through() {
        let gate = ChunkGate::new(3);
        let inside = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        let done = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..200 {
                        let _slot = gate.enter();
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::hint::spin_loop();
                        inside.fetch_sub(1, Ordering::SeqCst);
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        assert_eq!(done.load(Ordering::SeqCst), 1600);
        assert!(most.load(Ordering::SeqCst) <= 3);
        assert_eq!(gate.in_use(), 0, "every slot returned");
    }

    /// Two "loads" of 4 threads each through a gate of 4: they take turns, so each gets about
    /// half of the chunks while both run.
    #[test]
    fn two_loads_share_the_slots() {
        let gate = ChunkGate::new(4);
        let counts = [AtomicUsize::new(0), AtomicUsize::new(0)];
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            for load in 0..2 {
                for _ in 0..4 {
                    let (gate, counts, stop) = (&gate, &counts, &stop);
                    s.spawn(move || {
                        while !stop.load(Ordering::SeqCst) {
                            let _slot = gate.enter();
                            counts[load].fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(Duration::from_micros(200));
                        }
                    });
                }
            }
            std::thread::sleep(Duration::from_millis(300));
            stop.store(true, Ordering::SeqCst);
        });
        let (a, b) = (
            counts[0].load(Ordering::SeqCst),
            counts[1].load(Ordering::SeqCst),
        );
        let share = a as f64 / (a + b) as f64;
        assert!((0.35..=0.65).contains(&share), "shares {a} / {b}");
    }
}
