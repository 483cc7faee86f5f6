//! How `Model.torch()` cuts the arena into tensors: the plan of views, made here in one call so
//! that Python only asks torch for them.
//!
//! Tensors of one dtype and shape laid out at one spacing (a transformer's layers: every
//! layer's `q_proj` one layer apart) form a [`Run`], which torch makes with one `as_strided`
//! over all of them and one `unbind`; any other tensor is a run of one. A CUDA tensor costs
//! torch a microsecond or two to make whichever way; planning in Python cost as much again.

use modelshare_proto::v1 as pb;

use crate::tensor::element_bytes;

/// Tensors of one dtype and shape, at `first`, `first + step`, ... elements of the dtype into
/// the arena.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Run<'m> {
    pub dtype: pb::DType,
    pub shape: &'m [u64],
    /// The contiguous strides of `shape`, in elements.
    pub strides: Vec<u64>,
    pub first: u64,
    /// Elements from one tensor's start to the next's (0 for a run of one).
    pub step: u64,
    pub names: Vec<&'m str>,
}

/// Why a tensor cannot be a view of the arena seen as its dtype.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Unviewable {
    /// A dtype with no element size (`BYTES`, unspecified).
    Dtype { name: String },
    /// An offset that is not a whole number of elements (never, from this server: every
    /// tensor starts on a 256-byte boundary).
    Misaligned { name: String, offset: u64 },
}

/// What the tensors of one run share: dtype and shape.
type Kind<'m> = (pb::DType, &'m [u64]);

/// The runs that make `tensors` (in arena order, as a manifest lists them): grouped by dtype
/// and shape in order of first appearance, each group cut where the spacing changes.
pub(crate) fn plan<'m>(
    tensors: impl IntoIterator<Item = &'m pb::TensorInfo>,
) -> Result<Vec<Run<'m>>, Unviewable> {
    // (dtype, shape) -> the group's members (name, offset in elements), in arena order.
    let mut groups: Vec<(Kind<'m>, Vec<(&'m str, u64)>)> = Vec::new();
    for t in tensors {
        let size = element_bytes(t.dtype()).ok_or_else(|| Unviewable::Dtype {
            name: t.name.clone(),
        })?;
        if t.offset % size != 0 {
            return Err(Unviewable::Misaligned {
                name: t.name.clone(),
                offset: t.offset,
            });
        }
        let key = (t.dtype(), t.shape.as_slice());
        let member = (t.name.as_str(), t.offset / size);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(member),
            None => groups.push((key, vec![member])),
        }
    }
    let mut runs = Vec::new();
    for ((dtype, shape), members) in groups {
        let elements: u64 = shape.iter().product();
        let strides = contiguous_strides(shape);
        let mut run: Option<Run<'m>> = None;
        for (name, at) in members {
            if let Some(r) = run.as_mut() {
                let last = r.first + r.step * (r.names.len() as u64 - 1);
                let gap = at.saturating_sub(last);
                let fits = elements > 0 && gap >= elements && (r.names.len() == 1 || gap == r.step);
                if fits {
                    r.step = gap;
                    r.names.push(name);
                    continue;
                }
                runs.push(run.take().expect("a run is open"));
            }
            run = Some(Run {
                dtype,
                shape,
                strides: strides.clone(),
                first: at,
                step: 0,
                names: vec![name],
            });
        }
        runs.extend(run);
    }
    Ok(runs)
}

/// Row-major strides, in elements (a dimension of 0 counts as 1, as torch's own).
fn contiguous_strides(shape: &[u64]) -> Vec<u64> {
    let mut strides = vec![0; shape.len()];
    let mut step = 1;
    for (stride, dim) in strides.iter_mut().zip(shape).rev() {
        *stride = step;
        step *= (*dim).max(1);
    }
    strides
}
