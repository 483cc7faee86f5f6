//! The codec of every generated service: prost's, except that a message that does not decode
//! (a truncated field, a string that is not UTF-8, a bad wire type) is the sender's error,
//! `INVALID_ARGUMENT`, not tonic's `INTERNAL` (which would tell a client the server failed).

use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::ProstCodec;

/// [`ProstCodec`] with decode errors reported as `INVALID_ARGUMENT`.
#[derive(Debug, Clone, Default)]
pub struct StrictCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Codec for StrictCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
    type Decoder = StrictDecoder<<ProstCodec<T, U> as Codec>::Decoder>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        StrictDecoder(self.0.decoder())
    }
}

/// The decoder of [`StrictCodec`].
#[derive(Debug)]
pub struct StrictDecoder<D>(D);

impl<D: Decoder<Error = Status>> Decoder for StrictDecoder<D> {
    type Item = D::Item;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<D::Item>, Status> {
        self.0.decode(src).map_err(|e| {
            if e.code() == tonic::Code::Internal {
                Status::invalid_argument(format!("the message does not decode: {}", e.message()))
            } else {
                e
            }
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
