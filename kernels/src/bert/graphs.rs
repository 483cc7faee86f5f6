//! CUDA graphs of the forward pass, one per launch shape: a group's kernels (embeddings,
//! layers, pooling) captured once and replayed with one launch instead of ~50, which frees
//! the compute thread and the driver from per-kernel work and lets the GPU run a small
//! model's batches back to back. The copies up and down stay outside the graph (their sizes
//! are the group's own).
//!
//! A graph's kernels have fixed arguments, so a group is launched at a bucketed shape
//! ([`launch_shape`]): its tokens rounded up to a 32nd of their power of two (at most ~3%
//! more rows; the padding rows hold token 0 at position 0 and belong to no sequence, so
//! attention and pooling never read them), its sequences up to a power of two (the extra
//! ones of length 0, which the attention kernel skips and pooling writes as zeros, never
//! copied down), and attention over the longest length the limits allow (its kernel stops
//! at each sequence's own length). No real row reads a padded one; the real rows' values
//! are the unpadded pass's up to rounding (cuBLAS may pick another algorithm for the padded
//! row count).

use std::collections::{HashMap, HashSet, VecDeque};

use cudarc::driver::CudaGraph;

use super::pack::Group;

/// Graphs kept per encoder; past this the least recently used is dropped (a worker's load
/// uses a handful of shapes; each graph holds ~50 kernel nodes of device memory).
pub(super) const MAX_GRAPHS: usize = 64;

/// Launch shapes remembered as seen once (a shape is captured the second time it comes, so
/// that one-off shapes neither pay a capture nor push out graphs in use).
const SEEN_SHAPES: usize = 1024;

/// Token buckets are at least this many rows apart.
const MIN_TOKEN_STEP: usize = 64;

/// Token buckets per power of two.
const TOKEN_STEPS: usize = 32;

/// The shape `g` is launched at as a graph: see the module's notes. `max_tokens` is what the
/// buffers hold (≥ `g.t`), `max_sequences` the most sequences, `s` the padded longest length.
pub(super) fn launch_shape(g: Group, max_tokens: usize, max_sequences: usize, s: usize) -> Group {
    let floor = 1usize << (usize::BITS - 1 - g.t.max(1).leading_zeros());
    let step = (floor / TOKEN_STEPS).max(MIN_TOKEN_STEP);
    Group {
        b: g.b.next_power_of_two().clamp(g.b, max_sequences.max(g.b)),
        s: s.max(g.s),
        t: g.t.next_multiple_of(step).clamp(g.t, max_tokens.max(g.t)),
    }
}

/// A captured and instantiated graph.
pub(super) struct Graph(CudaGraph);

// SAFETY: a CUDA graph and its executable are not bound to the thread that made them; the
// driver asks only that calls on one graph be serialized. `Graph` is not `Sync` (its raw
// handles keep it so), and its owner, a `CudaBert`, launches it through `&mut self`, so
// calls on it come from one thread at a time.
unsafe impl Send for Graph {}

impl Graph {
    pub(super) fn new(graph: CudaGraph) -> Self {
        Self(graph)
    }

    pub(super) fn get(&self) -> &CudaGraph {
        &self.0
    }
}

/// The graphs by launch shape `(sequences, tokens)` (the length is the same for all), with
/// when each was last used; and the shapes seen once, oldest first.
#[derive(Default)]
pub(super) struct Graphs {
    by_shape: HashMap<(usize, usize), (Graph, u64)>,
    clock: u64,
    seen: HashSet<(usize, usize)>,
    seen_order: VecDeque<(usize, usize)>,
}

impl std::fmt::Debug for Graphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graphs")
            .field("shapes", &self.by_shape.len())
            .finish()
    }
}

impl Graphs {
    /// The graph for `g`'s shape, marked as just used.
    pub(super) fn get(&mut self, g: Group) -> Option<&Graph> {
        self.clock += 1;
        let now = self.clock;
        self.by_shape.get_mut(&(g.b, g.t)).map(|(graph, used)| {
            *used = now;
            &*graph
        })
    }

    /// Whether `g`'s shape (which has no graph) should be captured now: it came before.
    /// Else it is remembered (the oldest of [`SEEN_SHAPES`] forgotten) and runs kernel by
    /// kernel this time.
    pub(super) fn admit(&mut self, g: Group) -> bool {
        let key = (g.b, g.t);
        if self.seen.remove(&key) {
            self.seen_order.retain(|k| *k != key);
            return true;
        }
        if self.seen.len() >= SEEN_SHAPES
            && let Some(oldest) = self.seen_order.pop_front()
        {
            self.seen.remove(&oldest);
        }
        self.seen.insert(key);
        self.seen_order.push_back(key);
        false
    }

    /// Keeps `graph` for `g`'s shape, dropping the least recently used one if full (a graph
    /// still queued on the stream is freed by the driver once it completes).
    pub(super) fn insert(&mut self, g: Group, graph: Graph) -> &Graph {
        if self.by_shape.len() >= MAX_GRAPHS
            && let Some(oldest) = self
                .by_shape
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| *k)
        {
            self.by_shape.remove(&oldest);
        }
        self.clock += 1;
        let key = (g.b, g.t);
        self.by_shape.insert(key, (graph, self.clock));
        &self.by_shape[&key].0
    }
}

#[cfg(test)]
mod tests {
    use super::{Graphs, Group, SEEN_SHAPES, launch_shape};

    /// A shape would be captured the first time it comes (one-off shapes paying a capture and
    /// pushing out graphs in use), or never again once seen, or the seen set would grow
    /// without bound.
    #[test]
    fn shapes_are_captured_the_second_time_they_come() {
        let mut graphs = Graphs::default();
        let g = |b, t| Group { b, s: 256, t };
        assert!(
            !graphs.admit(g(128, 10_240)),
            "first time: run kernel by kernel"
        );
        assert!(graphs.admit(g(128, 10_240)), "second time: capture");
        assert!(
            !graphs.admit(g(128, 10_240)),
            "admitted once, then seen afresh"
        );
        for t in 0..SEEN_SHAPES + 10 {
            assert!(!graphs.admit(g(1, 64 * (t + 1))));
        }
        assert_eq!(graphs.seen.len(), SEEN_SHAPES);
        assert_eq!(graphs.seen_order.len(), SEEN_SHAPES);
        assert!(!graphs.admit(g(1, 64)), "the oldest was forgotten");
        assert!(
            graphs.admit(g(1, 64 * (SEEN_SHAPES + 10))),
            "the newest was kept"
        );
    }

    fn shape(b: usize, t: usize) -> (usize, usize, usize) {
        let g = launch_shape(Group { b, s: 40, t }, 17408, 128, 256);
        (g.b, g.s, g.t)
    }

    /// A graph launched at a shape below the group's would skip tokens or sequences; one far
    /// above wastes the GPU; one past the buffers writes outside them.
    #[test]
    fn launch_shapes_cover_the_group_within_the_buffers() {
        assert_eq!(shape(1, 1), (1, 256, 64));
        assert_eq!(shape(3, 70), (4, 256, 128));
        assert_eq!(shape(100, 2047), (128, 256, 2048));
        assert_eq!(shape(128, 2048), (128, 256, 2048));
        assert_eq!(shape(128, 2049), (128, 256, 2112));
        assert_eq!(shape(117, 10_000), (128, 256, 10_240));
        assert_eq!(
            shape(128, 17_400),
            (128, 256, 17_408),
            "capped at the buffers"
        );
        for t in 1..=17_408 {
            let (_, _, lt) = shape(1, t);
            assert!(lt >= t && lt <= 17_408, "{t} -> {lt}");
            assert!(
                lt <= t + (t / 32).max(63),
                "{t} -> {lt}: more than a 32nd over"
            );
        }
        // Never below the group, whatever the limits say.
        let g = launch_shape(
            Group {
                b: 5,
                s: 300,
                t: 900,
            },
            800,
            4,
            256,
        );
        assert_eq!((g.b, g.s, g.t), (5, 300, 900));
    }
}
