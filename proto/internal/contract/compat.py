"""Additive-only check of the Runtime contract.

Compares the descriptor set of the released contract with the current .proto
files: a removed, renumbered or retyped field, enum value, message, service
or RPC is a violation. Adding anything is fine. The contract may span several
files under several roots (the shared `proto/` and the Controller's
`Controller/api/proto`): everything is compared by fully-qualified name over
the union of the files, so a definition that moved to another file of the same
package is still there.

    python -m lj_runtimekit.proto.internal.contract.compat \
        --released proto/released/runtime_v1.binpb \
        --proto-root proto --proto-root Controller/api/proto \
        lingjun/runtime/v1/runtime.proto config_service.proto
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from google.protobuf import descriptor_pb2
from grpc_tools import protoc

FDS = descriptor_pb2.FileDescriptorSet


def compile_descriptor_set(proto_roots: Sequence[Path], files: Sequence[str]) -> FDS:
    """Compile .proto files, each relative to one of `proto_roots`, into one descriptor set."""
    paths = []
    for name in files:
        found = [root / name for root in proto_roots if (root / name).is_file()]
        if not found:
            raise ValueError(f"{name} is under none of {', '.join(map(str, proto_roots))}")
        paths.append(str(found[0]))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.binpb"
        roots = [f"--proto_path={root}" for root in proto_roots]
        if protoc.main(["protoc", *roots, f"--descriptor_set_out={out}", *paths]) != 0:
            raise ValueError(f"protoc failed on {', '.join(paths)}")
        return FDS.FromString(out.read_bytes())


def _messages(
    prefix: str, messages: Iterable[descriptor_pb2.DescriptorProto]
) -> dict[str, descriptor_pb2.DescriptorProto]:
    found: dict[str, descriptor_pb2.DescriptorProto] = {}
    for message in messages:
        name = f"{prefix}.{message.name}"
        found[name] = message
        found |= _messages(name, message.nested_type)
    return found


def _enums(fds: FDS) -> dict[str, descriptor_pb2.EnumDescriptorProto]:
    found: dict[str, descriptor_pb2.EnumDescriptorProto] = {}
    for file in fds.file:
        for enum in file.enum_type:
            found[f"{file.package}.{enum.name}"] = enum
        for name, message in _messages(file.package, file.message_type).items():
            for enum in message.enum_type:
                found[f"{name}.{enum.name}"] = enum
    return found


def _field_type(field: descriptor_pb2.FieldDescriptorProto) -> str:
    kind = descriptor_pb2.FieldDescriptorProto.Type.Name(field.type)
    label = descriptor_pb2.FieldDescriptorProto.Label.Name(field.label)
    return f"{label} {kind} {field.type_name}".strip()


def compare(released: FDS, current: FDS) -> list[str]:
    """Every incompatible change from `released` to `current`, as readable lines."""
    problems: list[str] = []
    old_messages = {
        n: m for f in released.file for n, m in _messages(f.package, f.message_type).items()
    }
    new_messages = {
        n: m for f in current.file for n, m in _messages(f.package, f.message_type).items()
    }
    for name, old in old_messages.items():
        new = new_messages.get(name)
        if new is None:
            problems.append(f"message {name} was removed")
            continue
        new_by_name = {f.name: f for f in new.field}
        new_by_number = {f.number: f for f in new.field}
        for field in old.field:
            where = f"field {name}.{field.name} = {field.number}"
            moved = new_by_name.get(field.name)
            if moved is not None and moved.number != field.number:
                problems.append(f"{where} was renumbered to {moved.number}")
                continue
            same = new_by_number.get(field.number)
            if same is None:
                problems.append(f"{where} was removed")
            elif same.name != field.name:
                problems.append(f"{where} was replaced by field {same.name}")
            elif _field_type(same) != _field_type(field):
                problems.append(
                    f"{where} was retyped from {_field_type(field)} to {_field_type(same)}"
                )
    old_enums, new_enums = _enums(released), _enums(current)
    for name, old_enum in old_enums.items():
        new_enum = new_enums.get(name)
        if new_enum is None:
            problems.append(f"enum {name} was removed")
            continue
        values = {v.name: v.number for v in new_enum.value}
        for value in old_enum.value:
            if value.name not in values:
                problems.append(f"enum value {name}.{value.name} = {value.number} was removed")
            elif values[value.name] != value.number:
                problems.append(
                    f"enum value {name}.{value.name} was renumbered"
                    f" from {value.number} to {values[value.name]}"
                )
    old_services = {f"{f.package}.{s.name}": s for f in released.file for s in f.service}
    new_services = {f"{f.package}.{s.name}": s for f in current.file for s in f.service}
    for name, service in old_services.items():
        new_service = new_services.get(name)
        if new_service is None:
            problems.append(f"service {name} was removed")
            continue
        methods = {m.name: m for m in new_service.method}
        for method in service.method:
            new_method = methods.get(method.name)
            if new_method is None:
                problems.append(f"rpc {name}.{method.name} was removed")
                continue
            old_sig = (
                method.input_type,
                method.output_type,
                method.client_streaming,
                method.server_streaming,
            )
            new_sig = (
                new_method.input_type,
                new_method.output_type,
                new_method.client_streaming,
                new_method.server_streaming,
            )
            if old_sig != new_sig:
                problems.append(
                    f"rpc {name}.{method.name} changed signature from {old_sig} to {new_sig}"
                )
    return problems


def main(argv: list[str] | None = None) -> int:
    """Compare the released descriptor set with the current protos, or write a new release."""
    parser = argparse.ArgumentParser(description="additive-only check of the Runtime contract")
    parser.add_argument("--released", type=Path, required=True, help="released descriptor set")
    parser.add_argument(
        "--proto-root",
        type=Path,
        action="append",
        required=True,
        help="a root of .proto files (repeat for several)",
    )
    parser.add_argument(
        "--write", action="store_true", help="record the current contract as released"
    )
    parser.add_argument(
        "protos", nargs="+", help=".proto files of the contract, each relative to a --proto-root"
    )
    args = parser.parse_args(argv)
    try:
        current = compile_descriptor_set(args.proto_root, args.protos)
    except ValueError as exc:
        print(f"check-contract: {exc}", file=sys.stderr)
        return 2
    if args.write:
        args.released.write_bytes(current.SerializeToString(deterministic=True))
        print(f"check-contract: recorded {', '.join(args.protos)} as released in {args.released}")
        return 0
    problems = compare(FDS.FromString(args.released.read_bytes()), current)
    for problem in problems:
        print(f"check-contract: {problem}", file=sys.stderr)
    if problems:
        print(
            f"check-contract: {len(problems)} incompatible change(s) against {args.released};"
            " the contract is additive-only: add new fields/RPCs instead",
            file=sys.stderr,
        )
        return 1
    print(f"check-contract: {' + '.join(args.protos)} compatible with {args.released}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
