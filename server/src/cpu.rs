//! [`CpuPool`]: the bounded pool that runs a request's CPU-heavy work (parsing a large body,
//! converting tensors, rendering a large answer) off the async runtime.
//!
//! The runtime's threads also carry every worker session's heartbeats and every other tenant's
//! small requests; a 57 MiB JSON body parsed on one of them held it for seconds. Work sent
//! here runs on tokio's blocking threads, at most `width` jobs at once (the rest wait their
//! turn, up to their deadline), so that at most `width` cores are spent on it however many
//! requests arrive and the runtime's threads stay free.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Semaphore;

/// Work on fewer bytes than this runs where it is asked for: a small request's parsing costs
/// microseconds, less than the hand-off, and must not wait behind other tenants' large ones.
pub const INLINE_BYTES: usize = 64 << 10;

/// Why a job of the pool did not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// The request's deadline passed while the job waited for its turn.
    #[error("the deadline passed while the request waited to be parsed")]
    DeadlineExceeded,
    /// The job panicked (a bug); the request fails, the server goes on.
    #[error("the request's parsing failed unexpectedly")]
    Panicked,
}

/// At most `width` jobs at once, on the runtime's blocking threads.
#[derive(Debug, Clone)]
pub struct CpuPool {
    slots: Arc<Semaphore>,
}

impl CpuPool {
    /// A pool of `width` (at least 1) jobs at once.
    pub fn new(width: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(width.max(1))),
        }
    }

    /// A pool of half the machine's cores (at least 1): the other half stays with the runtime.
    pub fn for_this_machine() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        Self::new(cores / 2)
    }

    /// Runs `job` on work of `bytes`: at once where it is asked for when small
    /// ([`INLINE_BYTES`]), else as [`Self::run`] does.
    pub async fn run_sized<T, F>(
        &self,
        bytes: usize,
        deadline: Instant,
        job: F,
    ) -> Result<T, PoolError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        if bytes < INLINE_BYTES {
            Ok(job())
        } else {
            self.run(deadline, job).await
        }
    }

    /// Runs `job` when a slot is free, or fails once `deadline` passes while waiting.
    pub async fn run<T, F>(&self, deadline: Instant, job: F) -> Result<T, PoolError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let permit = tokio::time::timeout_at(
            tokio::time::Instant::from_std(deadline),
            self.slots.clone().acquire_owned(),
        )
        .await
        .map_err(|_| PoolError::DeadlineExceeded)?
        .map_err(|_| PoolError::Panicked)?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            job()
        })
        .await
        .map_err(|_| PoolError::Panicked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// More jobs than the width never run at once; a job past its deadline in the queue fails.
    #[tokio::test]
    async fn at_most_width_jobs_run_and_a_late_one_gives_up() {
        let pool = CpuPool::new(2);
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let far = Instant::now() + Duration::from_secs(30);
        let jobs: Vec<_> = (0..8)
            .map(|_| {
                let (pool, running, most) = (pool.clone(), running.clone(), most.clone());
                tokio::spawn(async move {
                    pool.run(far, move || {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(20));
                        running.fetch_sub(1, Ordering::SeqCst);
                    })
                    .await
                })
            })
            .collect();
        for j in jobs {
            j.await.expect("join").expect("ran");
        }
        assert_eq!(most.load(Ordering::SeqCst), 2);

        let one = CpuPool::new(1);
        let slow = {
            let one = one.clone();
            tokio::spawn(async move {
                one.run(far, || std::thread::sleep(Duration::from_millis(300)))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let late = one
            .run(Instant::now() + Duration::from_millis(20), || ())
            .await;
        assert_eq!(late, Err(PoolError::DeadlineExceeded));
        slow.await.expect("join").expect("ran");
        assert_eq!(
            one.run(far, || panic!("a bug")).await,
            Err::<(), _>(PoolError::Panicked)
        );
    }
}
