import re
import shutil

from rlfleet.wire import codegen


def test_generated_stubs_match_protos():
    stale = codegen.stale_files()
    assert stale == [], f"regenerate with `make proto`: {stale}"


def test_check_ignores_generator_version_but_not_proto_changes(tmp_path):
    """Another grpcio-tools version writes other banners and version checks: not stale. A changed
    message, RPC or a missing file: stale."""
    gen = tmp_path / "gen"
    shutil.copytree(codegen.GEN_DIR, gen, ignore=shutil.ignore_patterns("__pycache__"))
    grpc_file = gen / "env_pb2_grpc.py"
    text = grpc_file.read_text()
    grpc_file.write_text(text.replace("GRPC_GENERATED_VERSION = '", "GRPC_GENERATED_VERSION = '0.0.0+"))
    pb2 = gen / "tensor_pb2.py"
    text = pb2.read_text()
    # another protoc: another banner and gencode version in the runtime check
    changed = re.sub(
        r"(ValidateProtobufRuntimeVersion\(\n\s+_runtime_version\.Domain\.PUBLIC,\n\s+)\d+",
        r"\g<1>5",
        text.replace("# Protobuf Python Version:", "# Protobuf Python Version: 99.0.0 was"),
    )
    assert changed != text and "Domain.PUBLIC,\n    5," in changed
    pb2.write_text(changed)
    assert codegen.stale_files(gen) == []

    pb2.write_text(pb2.read_text().replace(r"\x04name\x18\x01", r"\x04nome\x18\x01"))  # field Tensor.name renamed
    grpc_file.write_text(grpc_file.read_text().replace("/rlfleet.v1.EnvService/GetSpec", "/rlfleet.v1.EnvService/Spec"))
    (gen / "learner_pb2.pyi").unlink()
    assert codegen.stale_files(gen) == ["env_pb2_grpc.py", "learner_pb2.pyi", "tensor_pb2.py"]
