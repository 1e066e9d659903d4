import pytest

from keras_transformer.utils import processor
from tests.helpers import once

# Two processors' blocks as Linux lists them, shortened: the first one's
# flags are the answers.
CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx2 fma {flags}

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse2
"""


@pytest.fixture
def read_from(monkeypatch):
    """Points the module at another `/proc/cpuinfo`, its cached answers
    cleared then and after the test."""

    def clear():
        for cached in (processor.vendor, processor.flags, processor.model_name):
            cached.cache_clear()

    def point_at(path):
        monkeypatch.setattr(processor, "CPUINFO", str(path))
        clear()

    yield point_at
    clear()


@once
@pytest.mark.parametrize(
    "flags, amx, bfloat16, int8",
    [
        ("", False, False, False),  # AVX2 alone (AMD's Zen 3)
        ("avx512f avx512_vnni avx512_bf16", False, True, True),  # AMD's Zen 4 and 5
        ("avx512f avx512_vnni", False, False, True),  # AVX-512 without bfloat16 (Intel's Cascade Lake)
        ("avx_vnni", False, False, True),  # AVX-VNNI alone (Intel's Alder Lake)
        ("avx512_vnni amx_tile amx_bf16 amx_int8", True, True, True),  # Intel's Sapphire Rapids
    ],
)
def test_instructions_are_read_from_the_first_processors_flags(read_from, tmp_path, flags, amx, bfloat16, int8):
    (tmp_path / "cpuinfo").write_text(CPUINFO.format(flags=flags))
    read_from(tmp_path / "cpuinfo")
    assert (processor.has_amx(), processor.has_bfloat16_products(), processor.has_int8_dot_products()) == (
        amx, bfloat16, int8)
    assert processor.vendor() == "AuthenticAMD"
    answers = ", ".join(f"{what}: {'yes' if has else 'no'}" for what, has in
                        [("AMX", amx), ("bfloat16 products", bfloat16), ("int8 dot products", int8)])
    assert processor.describe().startswith("AMD EPYC, ") and processor.describe().endswith(answers)


@once
def test_no_cpuinfo_means_no_instructions(read_from, tmp_path):
    read_from(tmp_path / "missing")
    assert processor.vendor() == "" and processor.flags() == frozenset()
    assert not processor.has_int8_dot_products() and not processor.has_bfloat16_products()
    assert processor.model_name()  # Python's name for it, or "unknown"
