//! The weights of a BERT encoder as plain data over any handle type `T` (device offsets,
//! host slices, the SDK's tensors), with [`EncoderWeights::try_map`] to turn one kind of
//! handle into another. Finding them by name is the caller's business.

use crate::WeightDtype;

/// A linear layer `y = x·Wᵀ + b`: `weight` is `[out, in]`.
#[derive(Clone, Debug)]
pub struct Linear<T> {
    /// `[out, in]`.
    pub weight: T,
    /// `[out]`.
    pub bias: T,
}

/// A LayerNorm's scale and shift, `[hidden]` each.
#[derive(Clone, Debug)]
pub struct Norm<T> {
    /// Scale.
    pub gamma: T,
    /// Shift.
    pub beta: T,
}

/// The embedding tables and their LayerNorm.
#[derive(Clone, Debug)]
pub struct Embeddings<T> {
    /// `[vocab, hidden]`.
    pub word: T,
    /// `[max_positions, hidden]`.
    pub position: T,
    /// `[type_vocab, hidden]`, absent when the model has no token types.
    pub token_type: Option<T>,
    /// The LayerNorm after the sum.
    pub norm: Norm<T>,
}

/// One encoder layer (post-LayerNorm).
#[derive(Clone, Debug)]
pub struct Layer<T> {
    /// Query projection `[hidden, hidden]`.
    pub query: Linear<T>,
    /// Key projection.
    pub key: Linear<T>,
    /// Value projection.
    pub value: Linear<T>,
    /// Attention output projection `[hidden, hidden]`.
    pub attn_out: Linear<T>,
    /// LayerNorm after attention plus residual.
    pub attn_norm: Norm<T>,
    /// Feed-forward up `[intermediate, hidden]`.
    pub up: Linear<T>,
    /// Feed-forward down `[hidden, intermediate]`.
    pub down: Linear<T>,
    /// LayerNorm after the feed-forward plus residual.
    pub out_norm: Norm<T>,
}

/// Every weight of an encoder, all of one dtype.
#[derive(Clone, Debug)]
pub struct EncoderWeights<T> {
    /// The element type of every tensor.
    pub dtype: WeightDtype,
    /// Embeddings.
    pub embeddings: Embeddings<T>,
    /// Layers, first to last.
    pub layers: Vec<Layer<T>>,
}

impl<T> EncoderWeights<T> {
    /// The same weights with every handle mapped by `f` (embeddings first, then each layer).
    pub fn try_map<U, E>(
        &self,
        mut f: impl FnMut(&T) -> Result<U, E>,
    ) -> Result<EncoderWeights<U>, E> {
        let f: &mut dyn FnMut(&T) -> Result<U, E> = &mut f;
        let e = &self.embeddings;
        let embeddings = Embeddings {
            word: f(&e.word)?,
            position: f(&e.position)?,
            token_type: e.token_type.as_ref().map(&mut *f).transpose()?,
            norm: e.norm.try_map(f)?,
        };
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(Layer {
                    query: l.query.try_map(f)?,
                    key: l.key.try_map(f)?,
                    value: l.value.try_map(f)?,
                    attn_out: l.attn_out.try_map(f)?,
                    attn_norm: l.attn_norm.try_map(f)?,
                    up: l.up.try_map(f)?,
                    down: l.down.try_map(f)?,
                    out_norm: l.out_norm.try_map(f)?,
                })
            })
            .collect::<Result<_, E>>()?;
        Ok(EncoderWeights {
            dtype: self.dtype,
            embeddings,
            layers,
        })
    }
}

impl<T> Linear<T> {
    fn try_map<U, E>(&self, f: &mut dyn FnMut(&T) -> Result<U, E>) -> Result<Linear<U>, E> {
        Ok(Linear {
            weight: f(&self.weight)?,
            bias: f(&self.bias)?,
        })
    }
}

impl<T> Norm<T> {
    fn try_map<U, E>(&self, f: &mut dyn FnMut(&T) -> Result<U, E>) -> Result<Norm<U>, E> {
        Ok(Norm {
            gamma: f(&self.gamma)?,
            beta: f(&self.beta)?,
        })
    }
}
