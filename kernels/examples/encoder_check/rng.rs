//! The deterministic inputs.

use modelshare_kernels::WeightDtype;
use modelshare_kernels::reference::splitmix64;

use crate::buf::round;

/// Deterministic inputs: uniform in `[-scale, scale)`, rounded to `dtype`.
pub struct Rng(pub u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = splitmix64(self.0);
        self.0
    }
    fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32) * (1.0 / (1u64 << 23) as f32) - 1.0
    }
    pub fn values(&mut self, dtype: WeightDtype, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| round(dtype, self.unit() * scale)).collect()
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
