//! The wire check (see `wire/` and the crate's documentation): the contract the crate was built
//! from against the committed baseline, `wire-baseline.txt`; then the check itself, on changes
//! made in memory to the crate's descriptors.

#[path = "../wire/mod.rs"]
mod wire;

use prost_types::field_descriptor_proto::Type;
use prost_types::{
    DescriptorProto, EnumValueDescriptorProto, FieldDescriptorProto, FileDescriptorSet,
    ServiceDescriptorProto, descriptor_proto::ReservedRange,
};
use wire::compare::Report;
use wire::{Contract, compare};

/// A change of the `.proto` files that workers built from the baseline would misread, or one
/// that is compatible but not yet in the baseline (which must stay current, so that the next
/// change is compared with what is deployed).
#[test]
fn the_contract_matches_its_baseline() {
    let path = wire::baseline_path();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run: {}", path.display(), wire::UPDATE_COMMAND));
    let baseline = Contract::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let current = wire::current();
    let report = compare(&baseline, &current);
    assert!(
        !report.is_breaking(),
        "the .proto files changed in a way workers built from {} would misread:\n{}\
         Keep numbers and types; reserve the numbers of removed fields and values; add, do not \
         change.",
        path.display(),
        report.describe()
    );
    assert!(
        text == wire::baseline_text(&current),
        "the .proto files changed compatibly, but {} does not say so yet:\n{}\
         Run `{}` and commit the baseline with the change.",
        path.display(),
        if report.is_unchanged() {
            "  (its text differs from what --update writes)\n".to_owned()
        } else {
            report.describe()
        },
        wire::UPDATE_COMMAND
    );
}

/// The baseline's text would not read back as the contract it was written from, so the check
/// would compare with something else than what was committed.
#[test]
fn the_baseline_text_reads_back() {
    let mut current = wire::current();
    // Reserved numbers and names, which the contract has none of today.
    let hello = current.messages.get_mut("modelshare.v1.Hello").unwrap();
    hello.reserved = vec![(7, 7), (9, 12)];
    hello.reserved_names.insert("old_name".into());
    let dtype = current.enums.get_mut("modelshare.v1.DType").unwrap();
    dtype.reserved = vec![(40, 41)];
    dtype.reserved_names.insert("DTYPE_OLD".into());
    let text = wire::baseline_text(&current);
    assert_eq!(Contract::parse(&text).unwrap(), current);
    assert!(
        text.contains("\nreserved modelshare.v1.Hello 9-12\n"),
        "{text}"
    );
    assert!(text.contains("\nfield modelshare.v1.Hello 2 pid singular uint32\n"));
    assert!(text.contains(
        "\nrpc modelshare.v1.WorkerService Serve stream modelshare.v1.ServeRequest returns \
         stream modelshare.v1.ServeEvent\n"
    ));
    let bad = Contract::parse("field modelshare.v1.Nope 1 x singular string").unwrap_err();
    assert_eq!(bad.line, 1);
}

// The check itself: each test edits the crate's decoded descriptors as a .proto change would,
// and compares the result with the contract as built.

/// `package.Message` (nested: `package.Outer.Inner`) of `fds`.
fn message<'a>(fds: &'a mut FileDescriptorSet, full_name: &str) -> &'a mut DescriptorProto {
    let (package, path) = full_name
        .split_once('.')
        .and_then(|_| {
            ["modelshare.v1", "inference"]
                .into_iter()
                .find_map(|p| Some((p, full_name.strip_prefix(p)?.strip_prefix('.')?)))
        })
        .expect("a name in one of the two packages");
    let file = fds
        .file
        .iter_mut()
        .find(|f| {
            f.package() == package
                && f.message_type
                    .iter()
                    .any(|m| m.name() == path.split('.').next().unwrap())
        })
        .expect("the message's file");
    let mut names = path.split('.');
    let first = names.next().unwrap();
    let mut m = file
        .message_type
        .iter_mut()
        .find(|m| m.name() == first)
        .unwrap();
    for name in names {
        m = m.nested_type.iter_mut().find(|n| n.name() == name).unwrap();
    }
    m
}

/// Field `name` of `m`.
fn field<'a>(m: &'a mut DescriptorProto, name: &str) -> &'a mut FieldDescriptorProto {
    m.field.iter_mut().find(|f| f.name() == name).unwrap()
}

/// The `modelshare.v1.WorkerService` of `fds`.
fn worker_service(fds: &mut FileDescriptorSet) -> &mut ServiceDescriptorProto {
    fds.file
        .iter_mut()
        .flat_map(|f| f.service.iter_mut())
        .find(|s| s.name() == "WorkerService")
        .unwrap()
}

/// The report of the change `edit` makes to the crate's descriptors.
fn change(edit: impl FnOnce(&mut FileDescriptorSet)) -> Report {
    let mut fds = wire::descriptors();
    let before = Contract::from_descriptors(&fds);
    edit(&mut fds);
    compare(&before, &Contract::from_descriptors(&fds))
}

/// Asserts the report breaks, with a change that names every one of `words`.
fn assert_breaks(report: &Report, words: &[&str]) {
    assert!(
        report
            .breaking
            .iter()
            .any(|b| words.iter().all(|w| b.contains(w))),
        "expected a breaking change naming {words:?}, got:\n{}",
        report.describe()
    );
}

/// A renumbered field (a worker would read the old number as unknown) would pass.
#[test]
fn a_renumbered_field_breaks() {
    let report = change(|fds| {
        field(message(fds, "modelshare.v1.Hello"), "worker_name").number = Some(9);
    });
    assert_breaks(
        &report,
        &["modelshare.v1.Hello.worker_name (1)", "renumbered to 9"],
    );
    // Said once, as a renumbering: not also as a removal or an addition.
    assert_eq!(report.breaking.len(), 1, "{}", report.describe());
    assert!(report.compatible.is_empty(), "{}", report.describe());
}

/// A field whose number now carries another type would pass.
#[test]
fn a_retyped_field_breaks() {
    let report = change(|fds| {
        let pid = field(message(fds, "modelshare.v1.Hello"), "pid");
        pid.r#type = Some(Type::String as i32);
    });
    assert_breaks(
        &report,
        &["modelshare.v1.Hello.pid (2)", "from uint32 to string"],
    );
    // A message type changed for another is a change of type too.
    let report = change(|fds| {
        let device = field(message(fds, "modelshare.v1.Welcome"), "device");
        device.type_name = Some(".modelshare.v1.Hello".into());
    });
    assert_breaks(
        &report,
        &[
            "modelshare.v1.Welcome.device (3)",
            "message:modelshare.v1.DeviceInfo to message:modelshare.v1.Hello",
        ],
    );
}

/// A singular field made repeated (or the reverse) would pass.
#[test]
fn a_relabelled_field_breaks() {
    let report = change(|fds| {
        let pid = field(message(fds, "modelshare.v1.Hello"), "pid");
        pid.label = Some(prost_types::field_descriptor_proto::Label::Repeated as i32);
    });
    assert_breaks(
        &report,
        &["modelshare.v1.Hello.pid (2)", "from singular to repeated"],
    );
}

/// A field removed without reserving its number (a later field could take it, and old workers
/// would read that one as this) would pass; removed with its number reserved, it must.
#[test]
fn a_removed_field_breaks_unless_its_number_is_reserved() {
    let report = change(|fds| {
        message(fds, "modelshare.v1.Hello")
            .field
            .retain(|f| f.name() != "pid");
    });
    assert_breaks(
        &report,
        &[
            "modelshare.v1.Hello.pid (2)",
            "removed without reserving",
            "reserved 2;",
        ],
    );

    let report = change(|fds| {
        let hello = message(fds, "modelshare.v1.Hello");
        hello.field.retain(|f| f.name() != "pid");
        hello.reserved_range.push(ReservedRange {
            start: Some(2),
            end: Some(3),
        });
        hello.reserved_name.push("pid".into());
    });
    assert!(!report.is_breaking(), "{}", report.describe());
    assert!(
        report
            .compatible
            .iter()
            .any(|c| c.contains("modelshare.v1.Hello.pid (2) removed, its number reserved")),
        "{}",
        report.describe()
    );
}

/// A number given to another field (reused) would pass, whether it was free or reserved.
#[test]
fn a_reused_number_breaks() {
    let report = change(|fds| {
        field(message(fds, "modelshare.v1.Hello"), "pid").name = Some("process".into());
    });
    assert_breaks(
        &report,
        &["modelshare.v1.Hello.pid (2)", "now field 'process'"],
    );

    // From a baseline that reserves 9, a field taking 9.
    let mut fds = wire::descriptors();
    message(&mut fds, "modelshare.v1.Hello")
        .reserved_range
        .push(ReservedRange {
            start: Some(9),
            end: Some(10),
        });
    let before = Contract::from_descriptors(&fds);
    let hello = message(&mut fds, "modelshare.v1.Hello");
    hello.reserved_range.clear();
    let zone = FieldDescriptorProto {
        name: Some("zone".into()),
        number: Some(9),
        r#type: Some(Type::String as i32),
        ..field(hello, "worker_name").clone()
    };
    hello.field.push(zone);
    let report = compare(&before, &Contract::from_descriptors(&fds));
    assert_breaks(
        &report,
        &["modelshare.v1.Hello.zone (9)", "baseline reserves"],
    );
    assert_breaks(
        &report,
        &["message modelshare.v1.Hello no longer reserves 9"],
    );
}

/// A field moved into a oneof (setting another member would now clear it) would pass.
#[test]
fn a_field_moved_into_a_oneof_breaks() {
    let report = change(|fds| {
        let request = message(fds, "modelshare.v1.SessionRequest");
        field(request, "heartbeat").oneof_index = None;
    });
    assert_breaks(
        &report,
        &[
            "modelshare.v1.SessionRequest.heartbeat (2)",
            "from oneof kind to no oneof",
        ],
    );
}

/// A removed RPC (workers still call it) would pass.
#[test]
fn a_removed_rpc_breaks() {
    let report = change(|fds| {
        worker_service(fds).method.retain(|m| m.name() != "Release");
    });
    assert_breaks(
        &report,
        &["rpc modelshare.v1.WorkerService.Release removed"],
    );
}

/// An RPC whose streaming or messages changed would pass.
#[test]
fn a_reshaped_rpc_breaks() {
    let report = change(|fds| {
        let attach = worker_service(fds)
            .method
            .iter_mut()
            .find(|m| m.name() == "Attach")
            .unwrap();
        attach.server_streaming = Some(true);
    });
    assert_breaks(
        &report,
        &[
            "rpc modelshare.v1.WorkerService.Attach changed",
            "returns (stream modelshare.v1.AttachResponse)",
        ],
    );
}

/// The values of `modelshare.v1.DType`.
fn dtype_values(fds: &mut FileDescriptorSet) -> &mut Vec<EnumValueDescriptorProto> {
    let dtype = fds.file.iter_mut().flat_map(|f| f.enum_type.iter_mut());
    &mut dtype
        .into_iter()
        .find(|e| e.name() == "DType")
        .unwrap()
        .value
}

/// A removed enum value (old peers send it) or a renumbered one would pass.
#[test]
fn a_removed_or_renumbered_enum_value_breaks() {
    let report = change(|fds| {
        dtype_values(fds).retain(|v| v.name() != "DTYPE_C64");
    });
    assert_breaks(
        &report,
        &[
            "modelshare.v1.DType.DTYPE_C64 (17)",
            "removed without reserving",
        ],
    );
    let report = change(|fds| {
        let c64 = dtype_values(fds)
            .iter_mut()
            .find(|v| v.name() == "DTYPE_C64");
        c64.unwrap().number = Some(30);
    });
    assert_breaks(
        &report,
        &["modelshare.v1.DType.DTYPE_C64 (17)", "renumbered to 30"],
    );
}

/// A removed message that a remaining field used would pass.
#[test]
fn a_removed_message_in_use_breaks() {
    let report = change(|fds| {
        for f in &mut fds.file {
            f.message_type.retain(|m| m.name() != "DeviceInfo");
        }
    });
    assert_breaks(
        &report,
        &[
            "message modelshare.v1.DeviceInfo was removed",
            "field modelshare.v1.Welcome.device (3)",
        ],
    );
}

/// Additions (a field, a message, a value, an RPC) would fail as breaking, or go unreported
/// (so that the baseline would fall behind).
#[test]
fn additions_are_compatible_and_reported() {
    let report = change(|fds| {
        let hello = message(fds, "modelshare.v1.Hello");
        let mut zone = field(hello, "worker_name").clone();
        zone.name = Some("zone".into());
        zone.number = Some(5);
        hello.field.push(zone);
        let mut extra = message(fds, "modelshare.v1.Heartbeat").clone();
        extra.name = Some("Extra".into());
        let file = fds
            .file
            .iter_mut()
            .find(|f| f.name() == "modelshare/v1/worker.proto")
            .unwrap();
        file.message_type.push(extra);
        let mut ping = worker_service(fds).method[0].clone();
        ping.name = Some("Ping".into());
        worker_service(fds).method.push(ping);
    });
    assert!(!report.is_breaking(), "{}", report.describe());
    for added in [
        "field modelshare.v1.Hello.zone (5) added",
        "message modelshare.v1.Extra added",
        "rpc modelshare.v1.WorkerService.Ping added",
    ] {
        assert!(
            report.compatible.iter().any(|c| c == added),
            "missing '{added}':\n{}",
            report.describe()
        );
    }
    assert!(change(|_| {}).is_unchanged());
}
