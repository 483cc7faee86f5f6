//! One timer for every expiry in the server: unredeemed tickets, session heartbeats, and the
//! drain deadlines of unloads.
//!
//! Expiries go into one heap ordered by deadline; a single task sleeps until the earliest,
//! then hands it to the handler, which may ask to be called again later (a heartbeat that was
//! renewed meanwhile). So a session costs one entry, however often it beats, and no expiry
//! needs a task of its own.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Mutex;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Something that may have expired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expiry {
    /// A lease's one-time ticket: close its descriptor if it is still unredeemed.
    Ticket {
        /// The lease.
        lease: String,
        /// The ticket.
        ticket: String,
    },
    /// A session's heartbeat deadline: end the session if it stayed silent.
    Heartbeat {
        /// The session.
        session: String,
    },
    /// An unload's drain deadline: end the sessions still holding these versions.
    Drain {
        /// The model.
        model: String,
        /// The model's generation when it was unloaded.
        generation: u64,
        /// The versions that were draining.
        versions: Vec<u32>,
    },
}

/// A scheduled expiry; the heap orders entries by deadline, then by insertion.
#[derive(Debug)]
struct Entry {
    at: Instant,
    seq: u64,
    expiry: Expiry,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// The server's expiries.
#[derive(Debug, Default)]
pub struct Timer {
    heap: Mutex<(BinaryHeap<Reverse<Entry>>, u64)>,
    changed: Notify,
}

impl Timer {
    /// A timer with nothing scheduled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Calls the handler with `expiry` at `at` (or soon after).
    pub fn schedule(&self, at: Instant, expiry: Expiry) {
        let mut heap = self.heap.lock().unwrap_or_else(|e| e.into_inner());
        heap.1 += 1;
        let seq = heap.1;
        let earliest = heap.0.peek().is_none_or(|Reverse(e)| at < e.at);
        heap.0.push(Reverse(Entry { at, seq, expiry }));
        drop(heap);
        if earliest {
            self.changed.notify_one();
        }
    }

    /// Expiries scheduled and not yet handled.
    pub fn pending(&self) -> usize {
        self.heap.lock().unwrap_or_else(|e| e.into_inner()).0.len()
    }

    fn pop_due(&self, now: Instant) -> Result<Expiry, Option<Instant>> {
        let mut heap = self.heap.lock().unwrap_or_else(|e| e.into_inner());
        match heap.0.peek() {
            Some(Reverse(e)) if e.at <= now => heap.0.pop().map(|Reverse(e)| e.expiry).ok_or(None),
            Some(Reverse(e)) => Err(Some(e.at)),
            None => Err(None),
        }
    }

    /// Runs until `stop`: hands each due expiry to `handle`, which returns when to look at it
    /// again (`None`: done with it).
    pub async fn run(
        &self,
        stop: CancellationToken,
        mut handle: impl FnMut(&Expiry) -> Option<Instant>,
    ) {
        loop {
            let next = loop {
                match self.pop_due(Instant::now()) {
                    Ok(expiry) => {
                        if let Some(again) = handle(&expiry) {
                            self.schedule(again, expiry);
                        }
                    }
                    Err(next) => break next,
                }
            };
            let sleep = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = stop.cancelled() => return,
                () = self.changed.notified() => {}
                () = sleep => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    /// Expiries fire in deadline order whatever the order they were scheduled in, and a
    /// handler may push one back (a renewed heartbeat).
    #[tokio::test(start_paused = true)]
    async fn expiries_fire_in_order_and_can_be_renewed() {
        let timer = Arc::new(Timer::new());
        let t0 = Instant::now();
        let hb = |s: &str| Expiry::Heartbeat {
            session: s.to_owned(),
        };
        timer.schedule(t0 + Duration::from_millis(30), hb("c"));
        timer.schedule(t0 + Duration::from_millis(10), hb("a"));
        timer.schedule(t0 + Duration::from_millis(20), hb("b"));
        let stop = CancellationToken::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let task = {
            let (timer, stop, seen) = (timer.clone(), stop.clone(), seen.clone());
            tokio::spawn(async move {
                let mut renewed = false;
                timer
                    .run(stop, |e| {
                        let Expiry::Heartbeat { session } = e else {
                            return None;
                        };
                        seen.lock().unwrap().push(session.clone());
                        if session == "a" && !renewed {
                            renewed = true;
                            return Some(Instant::now() + Duration::from_millis(15));
                        }
                        None
                    })
                    .await;
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(*seen.lock().unwrap(), vec!["a", "b", "a", "c"]);
        assert_eq!(timer.pending(), 0);
        // A new, earlier deadline wakes the sleeping task.
        timer.schedule(Instant::now() + Duration::from_millis(5), hb("d"));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(seen.lock().unwrap().last().map(String::as_str), Some("d"));
        stop.cancel();
        task.await.unwrap();
    }
}
