//! The forward pass replayed as a CUDA graph ([`super::graphs`]): the launch shape's graph
//! launched, captured first if it has none. A capture that fails turns graphs off for the
//! encoder (the pass then launches each kernel, as without graphs) and says why once.

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, DriverError};

use super::graphs::Graph;
use super::model::CudaBert;
use super::pack::Group;
use crate::error::KernelError;

impl CudaBert {
    /// Enqueues the forward pass at launch shape `g` (its inputs already up) as its graph.
    pub(super) fn replay(&mut self, g: Group) -> Result<(), KernelError> {
        let Some(graphs) = self.graphs.as_mut() else {
            return self.forward(g, &mut |_| Ok(()));
        };
        if let Some(graph) = graphs.get(g) {
            return Ok(graph.get().launch()?);
        }
        match self.capture(g) {
            Ok(graph) => {
                self.captured += 1;
                let graphs = self.graphs.get_or_insert_default();
                Ok(graphs.insert(g, Graph::new(graph)).get().launch()?)
            }
            Err(why) => {
                self.graphs = None;
                self.graphs_failure = Some(format!(
                    "capturing the forward pass of {} sequences and {} tokens as a CUDA graph failed ({why}); \
                     each kernel is launched from now on",
                    g.b, g.t
                ));
                self.forward(g, &mut |_| Ok(()))
            }
        }
    }

    /// The forward pass at `g` captured from the stream (relaxed mode: this thread's other
    /// calls are not restricted, and the encoder's other threads are not affected) and
    /// instantiated. The stream leaves capture mode whatever fails.
    fn capture(&self, g: Group) -> Result<CudaGraph, String> {
        let text = |e: DriverError| e.to_string();
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(text)?;
        let pass = self.forward(g, &mut |_| Ok(()));
        let graph = self
            .stream
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(text);
        pass.map_err(|e| e.to_string())?;
        graph?.ok_or_else(|| "the capture gave no graph".to_owned())
    }
}
