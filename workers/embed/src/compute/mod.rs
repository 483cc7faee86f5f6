//! The compute thread: one OS thread owns the [`Encoder`](crate::encoder::Encoder) (and, for
//! CUDA, its context, stream and buffers), so that no device work runs on the async runtime or
//! under a lock. Handlers send it whole batches of sequences; it sorts them by length, cuts them
//! into groups that fit the encoder's limits (padding only to each group's longest), runs them
//! and answers in the caller's order. Between groups it looks at each sequence's cancellation
//! (the server cancelled its item: the caller went away or its deadline passed): a cancelled
//! sequence is not encoded, and a group left with none is skipped.
//!
//! A panic inside an encode call is caught there and fails the batch in flight
//! ([`EncodeError::Panicked`](crate::encoder::EncodeError::Panicked), logged at error level).
//! An encoder that [survives a panic](crate::encoder::Encoder::survives_panic) takes the next
//! batch; one that does not is never called again: the thread answers what is queued with
//! [`EncodeError::Stopped`](crate::encoder::EncodeError::Stopped), calls the compute's
//! `on_fatal` with the reason (the worker then stops serving and exits), and ends. Dropping the
//! [`ComputeThread`] closes its channel and joins the thread, once it has finished the batch at
//! hand; the encoder is dropped on the thread that made it.
//!
//! # Layout
//! - here: the map; what the worker uses is re-exported here.
//! - `thread`: [`ComputeThread`], the handle: start, encode, join.
//! - `slots`: [`Slots`], several compute threads of one version (`--compute-slots`), each
//!   batch sent to the least busy.
//! - `job`: a job ([`Encoded`] its answer), `OnFatal`, how the thread ends.
//! - `serve`: the thread's loop, and its end after a panic.
//! - `run`: one job: groups, cancellation, the rows in order.
//! - `plan`: `plan`, the grouping of sequences by length.
//! - `panics`: a panic in an encode call caught, and its message.

mod job;
mod panics;
mod plan;
mod run;
mod serve;
mod slots;
#[cfg(test)]
mod tests;
mod thread;

pub use self::job::Encoded;
pub use self::slots::Slots;
