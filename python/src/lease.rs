//! [`Lease`]: what keeps an attached version for this process, shared by a `Model` and every
//! tensor, array and DLPack tensor taken from it.

use std::sync::Arc;

use crate::runtime::OnRuntime;

/// The lease on an attached version: the SDK's `Model`, which releases it when dropped (and
/// keeps its session open while it lives), dropped on the runtime. Shared by the Python `Model`
/// and every `Tensor` taken from it, and so by every numpy array (its base is a `Tensor`) and
/// DLPack capsule or consumer's tensor (its managed tensor owns a clone): the lease goes when
/// the last of them does.
pub(crate) type Lease = Arc<OnRuntime<modelshare_worker::Model>>;
