//! Triton's extension answers of the OIP gRPC service (`ModelConfig`, `RepositoryIndex`,
//! `ModelStatistics`), made from what `front::triton` gives both doors.

use modelshare_proto::inference as oip;
use modelshare_proto::v1 as pb;
use modelshare_serving::{Tally, VersionStats};

use crate::front::triton::{IndexEntry, ModelConfig, config_type};

/// The configuration as Triton's `ModelConfig` message.
pub fn config(c: ModelConfig) -> oip::ModelConfig {
    let data_type = |s: &pb::TensorSpec| {
        oip::DataType::from_str_name(config_type(&s.datatype)).unwrap_or(oip::DataType::TypeInvalid)
            as i32
    };
    oip::ModelConfig {
        name: c.name,
        platform: "modelshare".into(),
        backend: "modelshare".into(),
        max_batch_size: c.max_batch_size,
        input: c
            .inputs
            .iter()
            .map(|s| oip::ModelInput {
                name: s.name.clone(),
                data_type: data_type(s),
                dims: s.shape.clone(),
            })
            .collect(),
        output: c
            .outputs
            .iter()
            .map(|s| oip::ModelOutput {
                name: s.name.clone(),
                data_type: data_type(s),
                dims: s.shape.clone(),
            })
            .collect(),
        dynamic_batching: Some(oip::ModelDynamicBatching {
            preferred_batch_size: Vec::new(),
            max_queue_delay_microseconds: c.max_queue_delay_us,
        }),
    }
}

/// The index as Triton's `RepositoryIndexResponse`.
pub fn index(entries: Vec<IndexEntry>) -> oip::RepositoryIndexResponse {
    oip::RepositoryIndexResponse {
        models: entries
            .into_iter()
            .map(|e| oip::repository_index_response::ModelIndex {
                name: e.name,
                version: e.version.to_string(),
                state: e.state.into(),
                reason: e.reason,
            })
            .collect(),
    }
}

/// `t`'s count with no time.
fn no_time(t: Tally) -> Tally {
    Tally {
        count: t.count,
        ns: 0,
    }
}

/// The statistics as Triton's `ModelStatisticsResponse`.
pub fn statistics(stats: Vec<(String, VersionStats)>) -> oip::ModelStatisticsResponse {
    let duration = |t: Tally| {
        Some(oip::StatisticDuration {
            count: t.count,
            ns: t.ns,
        })
    };
    oip::ModelStatisticsResponse {
        model_stats: stats
            .into_iter()
            .map(|(name, v)| oip::ModelStatistics {
                name,
                version: v.version.to_string(),
                last_inference: v.last_answer_unix_ms,
                inference_count: v.items,
                execution_count: v.compute.count,
                inference_stats: Some(oip::InferStatistics {
                    success: duration(v.success),
                    fail: duration(v.fail),
                    queue: duration(v.queue),
                    // The worker's time is one figure, all of it the model's execution; the
                    // input and output steps keep its count (readers divide by it), no time.
                    compute_input: duration(no_time(v.compute)),
                    compute_infer: duration(v.compute),
                    compute_output: duration(no_time(v.compute)),
                }),
                batch_stats: v
                    .by_batch_size
                    .into_iter()
                    .map(|(size, t)| oip::InferBatchStatistics {
                        batch_size: size,
                        compute_input: duration(no_time(t)),
                        compute_infer: duration(t),
                        compute_output: duration(no_time(t)),
                    })
                    .collect(),
            })
            .collect(),
    }
}
