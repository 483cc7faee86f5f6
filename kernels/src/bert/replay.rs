//! The forward pass replayed as a CUDA graph ([`super::graphs`]): the launch shape's graph
//! launched, captured first if it has none and the shape came before (a shape's first pass
//! runs kernel by kernel, which also loads every module and cuBLAS kernel the capture will
//! record), and each kernel launched without graphs. A capture that fails turns graphs off for the encoder (the pass then
//! launches each kernel, as without graphs) and says why once.

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode, CUstreamCaptureStatus};
use cudarc::driver::{CudaGraph, DriverError, result};

use super::graphs::Graph;
use super::model::CudaBert;
use super::pack::Group;
use crate::error::KernelError;

impl CudaBert {
    /// Enqueues the forward pass at launch shape `g` (its inputs already up): as its graph
    /// where graphs are in use and the shape has one or came before, else kernel by kernel.
    pub(super) fn replay(&mut self, g: Group) -> Result<(), KernelError> {
        let Some(graphs) = self.graphs.as_mut() else {
            return self.forward(g, &mut |_| Ok(()));
        };
        if let Some(graph) = graphs.get(g) {
            return Ok(graph.get().launch()?);
        }
        if !graphs.admit(g) {
            return self.forward(g, &mut |_| Ok(()));
        }
        match self.capture(g) {
            Ok(graph) => {
                self.captured += 1;
                let graphs = self.graphs.get_or_insert_default();
                Ok(graphs.insert(g, Graph::new(graph)).get().launch()?)
            }
            Err(why) => {
                self.end_open_capture()?;
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

    /// Ends a capture the stream is still in after a failed one, dropping what it recorded:
    /// cudarc's `end_capture` first takes any error another thread left in the context and
    /// returns it without ending the capture, and the pass run next must not be recorded
    /// instead of run. `Err` if the stream cannot be brought out of capture mode.
    fn end_open_capture(&self) -> Result<(), DriverError> {
        let stream = self.stream.cu_stream();
        // SAFETY: `stream` is this encoder's live stream, whose context the failed capture
        // bound to this thread; the query only reads its state.
        let capturing = |s| unsafe { result::stream::is_capturing(s) };
        if capturing(stream)? == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Ok(());
        }
        // SAFETY: the stream is in a capture this thread began (active or invalidated);
        // ending it gives back the graph recorded so far, which nothing else holds and which
        // is destroyed here (an invalidated capture ends with an error and no graph).
        if let Ok(graph) = unsafe { result::stream::end_capture(stream) }
            && !graph.is_null()
        {
            // SAFETY: as above; the graph was never instantiated.
            unsafe { result::graph::destroy(graph) }?;
        }
        match capturing(stream)? {
            CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => Ok(()),
            _ => Err(DriverError(
                cudarc::driver::sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
            )),
        }
    }
}
