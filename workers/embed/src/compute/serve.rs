//! The compute thread's loop: jobs in turn until every handle is gone, or until a panic the
//! encoder does not survive.

use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tracing::{error, info};

use super::job::{Job, OnFatal, ThreadEnd};
use super::panics::panic_message;
use super::run::run;
use crate::encoder::{EncodeError, Encoder};

/// The compute thread's life once its encoder is built: runs jobs until every handle is
/// gone (`Ok`), or until a panic the encoder does not survive (or one of the loop itself).
/// Then it answers the jobs queued, refuses later ones, calls `on_fatal`, and drops the
/// encoder last (after a panic, even its drop might misbehave).
pub(super) fn serve(
    mut encoder: Box<dyn Encoder>,
    jobs: mpsc::Receiver<Job>,
    on_fatal: OnFatal,
    profile: bool,
) -> ThreadEnd {
    let mut time = Time::default();
    let ended = panic::catch_unwind(AssertUnwindSafe(|| {
        take_jobs(encoder.as_mut(), &jobs, &mut time)
    }))
    .unwrap_or_else(|payload| {
        let message = panic_message(payload.as_ref());
        error!(panic = %message, "the compute thread's loop panicked");
        Err(format!("the compute thread panicked: {message}"))
    });
    if let Err(reason) = &ended {
        for job in jobs.try_iter() {
            let _ = job.reply.send(Err(EncodeError::Stopped(reason.clone())));
        }
        drop(jobs);
        on_fatal(reason.clone());
    }
    if profile {
        let stages = encoder
            .stage_report()
            .unwrap_or_else(|| "no stage times".to_owned());
        info!(
            jobs = time.jobs,
            sequences = time.sequences,
            busy_s = time.busy.as_secs_f64(),
            idle_s = time.idle.as_secs_f64(),
            queued_s = time.queued.as_secs_f64(),
            "profile: compute thread; {stages}"
        );
    }
    drop(encoder);
    ended
}

/// Where the compute thread's time went: running jobs, or waiting for one; and how long its
/// jobs waited for it, summed.
#[derive(Debug, Default)]
struct Time {
    jobs: u64,
    sequences: u64,
    busy: Duration,
    idle: Duration,
    queued: Duration,
}

/// Runs jobs in turn until the channel closes (`Ok`) or the encoder panicked and does not
/// survive it (`Err`, the reason). A job whose caller has gone (its handler call aborted) is
/// skipped.
fn take_jobs(encoder: &mut dyn Encoder, jobs: &mpsc::Receiver<Job>, time: &mut Time) -> ThreadEnd {
    let mut waiting = Instant::now();
    while let Ok(job) = jobs.recv() {
        if job.reply.is_closed() {
            continue;
        }
        let started = Instant::now();
        // The first wait (for the first job) is not idle time under load.
        if time.jobs > 0 {
            time.idle += started - waiting;
        }
        time.queued += started.saturating_duration_since(job.sent);
        let result = run(encoder, &job.seqs, &job.cancels);
        waiting = Instant::now();
        time.busy += waiting - started;
        time.jobs += 1;
        time.sequences += job.seqs.len() as u64;
        let fatal = match &result {
            Err(EncodeError::Panicked(message)) => {
                let survives = encoder.survives_panic();
                error!(
                    panic = %message,
                    sequences = job.seqs.len(),
                    survives,
                    "the encoder panicked; its batch fails"
                );
                (!survives).then(|| format!("the encoder panicked: {message}"))
            }
            _ => None,
        };
        let _ = job.reply.send(result);
        if let Some(reason) = fatal {
            return Err(reason);
        }
    }
    Ok(())
}
