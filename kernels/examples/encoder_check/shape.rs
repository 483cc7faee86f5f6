//! The shapes the checks run over.

/// One shape the checks run over.
#[derive(Clone, Debug)]
pub struct Shape {
    pub batch: usize,
    pub seq: usize,
    pub hidden: usize,
    pub heads: usize,
    pub lengths: Vec<i32>,
    /// Elements every buffer starts past its (256-byte aligned) allocation: 1 forces the
    /// scalar kernels.
    pub offset: usize,
    pub type_ids: bool,
    pub position_offset: usize,
}

impl Shape {
    pub fn tokens(&self) -> usize {
        self.batch * self.seq
    }
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
    pub fn label(&self) -> String {
        format!(
            "b{} s{} h{} nh{} len{:?}{}",
            self.batch,
            self.seq,
            self.hidden,
            self.heads,
            self.lengths,
            if self.offset > 0 { " +1" } else { "" }
        )
    }
}

pub fn shapes() -> Vec<Shape> {
    vec![
        Shape {
            batch: 3,
            seq: 7,
            hidden: 100,
            heads: 4,
            lengths: vec![7, 3, 0],
            offset: 0,
            type_ids: true,
            position_offset: 2,
        },
        Shape {
            batch: 2,
            seq: 16,
            hidden: 384,
            heads: 6,
            lengths: vec![16, 9],
            offset: 0,
            type_ids: false,
            position_offset: 0,
        },
        Shape {
            batch: 1,
            seq: 5,
            hidden: 384,
            heads: 12,
            lengths: vec![5],
            offset: 1,
            type_ids: true,
            position_offset: 0,
        },
        Shape {
            batch: 2,
            seq: 40,
            hidden: 1024,
            heads: 16,
            lengths: vec![40, 17],
            offset: 0,
            type_ids: true,
            position_offset: 0,
        },
    ]
}
