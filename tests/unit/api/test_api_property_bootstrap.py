"""Bootstrap data with odd sizes and content: a valid result or a typed error, never a crash.

`capl.ports.bootstrap` is what turns a bootstrap Secret into what the guest reads:
`validate_ignition` (before the Ignition file is uploaded for fw_cfg) and
`build_nocloud_iso` (the cloud-init seed). Properties:

- `validate_ignition(data)` for any bytes (empty, whitespace, NUL, binary, invalid UTF-8,
  non-object JSON, a BOM, 1 MiB of valid or invalid JSON) returns the parsed object or
  raises `BootstrapDataError`; the message never contains the data (it is secret);
- `build_nocloud_iso` for any user-data (empty, block-size edges, 1 MiB, binary) and any
  instance id / hostname gives an ISO 9660 image labelled ``cidata`` whose ``user-data``,
  ``meta-data`` (and ``network-config``) read back byte for byte through Joliet and Rock
  Ridge, with meta-data parsing back to the given identity.

Edge cases pinned: deeply nested JSON, an integer literal beyond Python's 4300-digit limit,
``"3.4.0\\n"`` as a version and ``NaN`` are each a BootstrapDataError (Ignition's own parser
rejects them too), never an untyped exception.
"""

from __future__ import annotations

import io
import json
import secrets
import time

import pycdlib
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from capl.ports import bootstrap
from capl.ports.bootstrap import NOCLOUD_LABEL, build_nocloud_iso, validate_ignition
from capl.ports.errors import BootstrapDataError

MIB = 1024 * 1024
SECRET = "capl-secret-" + secrets.token_hex(8)


def _ignition(extra: dict[str, object] | None = None, *, version: str = "3.4.0") -> bytes:
    return json.dumps({"ignition": {"version": version}, **(extra or {})}).encode()


def _outcome(data: bytes) -> dict[str, object] | BootstrapDataError:
    try:
        return validate_ignition(data)
    except BootstrapDataError as exc:
        return exc


# --- Ignition ------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(data=st.binary(max_size=2048))
@example(data=b"")
@example(data=b" \n\t ")
@example(data=b"\x00")
@example(data=b"\xff\xfe{}")
@example(data=b"\xef\xbb\xbf" + _ignition())
@example(data=b"null")
@example(data=b"[]")
@example(data=b'"ignition"')
@example(data=b'{"ignition": 1}')
@example(data=b'{"ignition": {"version": 3}}')
@example(data=b'{"ignition": {"version": "latest"}}')
@example(data=_ignition()[:-1])
def test_any_bytes_give_a_config_or_a_typed_error(data: bytes) -> None:
    result = _outcome(data)
    if isinstance(result, BootstrapDataError):
        assert result.reason == "BootstrapDataInvalid"
        assert str(result).startswith("Ignition config")
    else:
        assert isinstance(result["ignition"], dict)


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    doc=json_values,
    wrap=st.booleans(),
    version=st.sampled_from(["3.4.0", "3.0.0", "3.5.0-experimental", "2", "", "x.y.z"]),
)
def test_json_documents_are_accepted_only_with_an_ignition_version(
    doc: object, wrap: bool, version: str
) -> None:
    body = {"ignition": {"version": version}, "payload": doc} if wrap else doc
    data = json.dumps(body).encode()
    result = _outcome(data)
    valid = wrap and version in ("3.4.0", "3.0.0", "3.5.0-experimental")
    assert isinstance(result, dict) == valid, (body, result)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", "empty"),
        (b"   \n", "empty"),
        (b"\xc3\x28" + SECRET.encode(), "not valid UTF-8 (byte 0)"),
        (b"{" + SECRET.encode(), "not valid JSON"),
        (json.dumps([SECRET]).encode(), "must be a JSON object, got list"),
        (json.dumps({"passwd": SECRET}).encode(), 'no "ignition" object'),
        (json.dumps({"ignition": {"version": SECRET}}).encode(), 'no valid "ignition.version"'),
        (SECRET.encode() * (MIB // len(SECRET)), "not valid JSON"),
        (bytes(range(256)) * (MIB // 256), "not valid UTF-8"),
    ],
    ids=[
        "empty",
        "blank",
        "utf8",
        "json",
        "array",
        "no-section",
        "version",
        "1MiB-text",
        "1MiB-bin",
    ],
)
def test_malformed_configs_name_the_problem_and_not_the_content(data: bytes, expected: str) -> None:
    with pytest.raises(BootstrapDataError) as info:
        validate_ignition(data)
    assert expected in str(info.value)
    assert SECRET not in str(info.value)
    assert SECRET not in repr(info.value)
    assert len(str(info.value)) < 200


def test_a_one_mebibyte_config_is_accepted() -> None:
    blob = "data:;base64," + "A" * MIB
    data = _ignition({"storage": {"files": [{"path": "/big", "contents": {"source": blob}}]}})
    assert len(data) > MIB
    parsed = validate_ignition(data)
    assert parsed["storage"]["files"][0]["contents"]["source"] == blob


def test_deeply_nested_json_is_a_typed_error() -> None:
    with pytest.raises(BootstrapDataError):
        validate_ignition(b"[" * 100_000)


def test_a_huge_integer_is_a_typed_error() -> None:
    with pytest.raises(BootstrapDataError):
        validate_ignition(b'{"ignition": {"version": "3.4.0"}, "n": ' + b"9" * 5000 + b"}")


def test_a_version_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(BootstrapDataError):
        validate_ignition(_ignition(version="3.4.0\n"))


def test_non_json_constants_are_refused() -> None:
    with pytest.raises(BootstrapDataError):
        validate_ignition(b'{"ignition": {"version": "3.4.0"}, "x": NaN}')


# --- NoCloud ISO -----------------------------------------------------------------------------


def _read_iso(image: bytes) -> tuple[str, dict[str, bytes], dict[str, bytes]]:
    """(volume label, files by Joliet path, files by Rock Ridge path)."""
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(image))
    try:
        label = iso.pvd.volume_identifier.decode().strip()
        joliet: dict[str, bytes] = {}
        rock: dict[str, bytes] = {}
        for name in ("user-data", "meta-data", "network-config"):
            for kind, store in (("joliet_path", joliet), ("rr_path", rock)):
                out = io.BytesIO()
                try:
                    iso.get_file_from_iso_fp(out, **{kind: f"/{name}"})
                except pycdlib.pycdlibexception.PyCdlibInvalidInput:
                    continue
                store[name] = out.getvalue()
        return label, joliet, rock
    finally:
        iso.close()


def _check_iso(
    image: bytes,
    *,
    user_data: bytes,
    instance_id: str,
    hostname: str,
    network_config: bytes | None,
) -> None:
    assert len(image) % 2048 == 0
    label, joliet, rock = _read_iso(image)
    assert label == NOCLOUD_LABEL
    expected_names = {"user-data", "meta-data"}
    if network_config is not None:
        expected_names.add("network-config")
    assert set(joliet) == expected_names
    assert set(rock) == expected_names
    for files in (joliet, rock):
        assert files["user-data"] == user_data
        if network_config is not None:
            assert files["network-config"] == network_config
        meta = yaml.safe_load(files["meta-data"])
        assert meta == {"instance-id": instance_id, "local-hostname": hostname}


@pytest.mark.parametrize(
    "size", [0, 1, 2047, 2048, 2049, 64 * 1024, MIB - 1, MIB, MIB + 1], ids=lambda s: f"{s}B"
)
def test_nocloud_iso_carries_user_data_of_any_size(size: int) -> None:
    user_data = (b"#cloud-config\n" + secrets.token_bytes(size))[:size]
    image = build_nocloud_iso(user_data=user_data, instance_id="i-1", hostname="m-0")
    _check_iso(image, user_data=user_data, instance_id="i-1", hostname="m-0", network_config=None)


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    user_data=st.binary(max_size=5000),
    instance_id=st.text(min_size=1, max_size=40),
    hostname=st.text(max_size=40),
    network_config=st.none() | st.binary(max_size=600),
)
@example(user_data=b"", instance_id="i", hostname="", network_config=b"")
@example(
    user_data=b"\x00" * 2048, instance_id="a: b\n- c", hostname="'\"#&*!|>%@`", network_config=None
)
def test_nocloud_iso_round_trips_any_content(
    user_data: bytes, instance_id: str, hostname: str, network_config: bytes | None
) -> None:
    image = build_nocloud_iso(
        user_data=user_data,
        instance_id=instance_id,
        hostname=hostname,
        network_config=network_config,
    )
    _check_iso(
        image,
        user_data=user_data,
        instance_id=instance_id,
        hostname=hostname,
        network_config=network_config,
    )


# --- the layout kept per size triple (capl.ports.bootstrap._layout) -------------------------


def _pycdlib_image(files: list[tuple[str, str, bytes]]) -> bytes:
    """The seed as pycdlib writes it with the files' bytes (what build_nocloud_iso made
    before it kept layouts)."""
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, vol_ident=NOCLOUD_LABEL, joliet=3, rock_ridge="1.09")
    try:
        for iso_name, long_name, content in files:
            iso.add_fp(
                io.BytesIO(content),
                len(content),
                f"/{iso_name}",
                rr_name=long_name,
                joliet_path=f"/{long_name}",
            )
        out = io.BytesIO()
        iso.write_fp(out)
    finally:
        iso.close()
    return out.getvalue()


@pytest.mark.parametrize("size", [0, 1, 2047, 2048, 2049, 70_000], ids=lambda s: f"{s}B")
@pytest.mark.parametrize("network", [None, b"", b"version: 2\n"], ids=["nonet", "empty", "net"])
def test_nocloud_iso_is_the_image_pycdlib_writes(
    size: int, network: bytes | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pycdlib stamps the time of making into the image: the same time for both sides
    monkeypatch.setattr(time, "time", lambda: 1_800_000_000.0)
    bootstrap._layout.cache_clear()
    user_data = secrets.token_bytes(size)
    image = build_nocloud_iso(
        user_data=user_data, instance_id="i-1", hostname="m-0", network_config=network
    )
    meta = bootstrap.nocloud_meta_data(instance_id="i-1", hostname="m-0")
    files = [("USERDATA.;1", "user-data", user_data), ("METADATA.;1", "meta-data", meta)]
    if network is not None:
        files.append(("NETWORKC.;1", "network-config", network))
    assert image == _pycdlib_image(files)


def test_nocloud_layout_reused_carries_only_its_own_seed() -> None:
    bootstrap._layout.cache_clear()
    first, second = secrets.token_bytes(3000), secrets.token_bytes(3000)
    net_a, net_b = b"version: 2\n# " + b"a" * 40, b"version: 2\n# " + b"b" * 40
    image_a = build_nocloud_iso(
        user_data=first, instance_id="uid-a", hostname="m-a", network_config=net_a
    )
    image_b = build_nocloud_iso(
        user_data=second, instance_id="uid-b", hostname="m-b", network_config=net_b
    )
    assert bootstrap._layout.cache_info().hits == 1  # same sizes: laid out once
    _check_iso(image_b, user_data=second, instance_id="uid-b", hostname="m-b", network_config=net_b)
    assert first not in image_b
    assert net_a not in image_b
    assert b"uid-a" not in image_b
    _check_iso(image_a, user_data=first, instance_id="uid-a", hostname="m-a", network_config=net_a)
    # another size: its own layout
    build_nocloud_iso(user_data=first + b"x", instance_id="uid-a", hostname="m-a")
    assert bootstrap._layout.cache_info().misses == 2


@pytest.mark.parametrize(
    ("instance_id", "hostname"),
    [("true", "123"), ("null", "0x1f"), ('a"b\\c', "x: y #z"), ("é", "m\u2028"), ("~", "")],
)
def test_nocloud_meta_data_reads_back_as_strings(instance_id: str, hostname: str) -> None:
    meta = yaml.safe_load(bootstrap.nocloud_meta_data(instance_id=instance_id, hostname=hostname))
    assert meta == {"instance-id": instance_id, "local-hostname": hostname}
