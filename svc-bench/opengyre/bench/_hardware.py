"""Public accelerator specs for the roofline: peak dense BF16 tensor FLOP/s, HBM bandwidth and capacity.

Dense means without 2:4 structured sparsity (vendors often headline the sparse figure, twice as large).
Each entry names the datasheet it comes from; bytes are decimal (GB = 1e9), as the datasheets use them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HARDWARE", "Hardware", "hardware"]


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_flops: float  # dense BF16 tensor FLOP/s
    hbm_bandwidth: float  # bytes/s
    hbm_capacity: float  # bytes
    source: str

    @property
    def ridge(self) -> float:
        """Operational intensity (FLOP/byte) above which a kernel is compute-bound: Ppeak / BWpeak."""
        return self.peak_flops / self.hbm_bandwidth


_T = 1e12
_G = 1e9

HARDWARE: dict[str, Hardware] = {
    h.name: h
    for h in (
        Hardware(
            "H100",
            989.4 * _T,
            3.35e12,
            80 * _G,
            "NVIDIA H100 Tensor Core GPU datasheet, SXM5: BF16 1,979 TFLOPS with sparsity (989.4 dense), "
            "HBM3 3.35 TB/s, 80 GB",
        ),
        Hardware(
            "H200",
            989.4 * _T,
            4.8e12,
            141 * _G,
            "NVIDIA H200 Tensor Core GPU datasheet, SXM: BF16 1,979 TFLOPS with sparsity (989.4 dense), "
            "HBM3e 4.8 TB/s, 141 GB",
        ),
        Hardware(
            "B200",
            2250 * _T,
            8.0e12,
            180 * _G,
            "NVIDIA HGX B200 datasheet (per GPU): FP16/BF16 4.5 PFLOPS with sparsity (2.25 dense), "
            "HBM3e 8 TB/s, 180 GB",
        ),
        Hardware(
            "A100",
            312 * _T,
            2.039e12,
            80 * _G,
            "NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM: BF16 312 TFLOPS dense (624 sparse), "
            "HBM2e 2,039 GB/s, 80 GB",
        ),
        Hardware(
            "L40S",
            362.05 * _T,
            864 * _G,
            48 * _G,
            "NVIDIA L40S datasheet: BF16 362.05 TFLOPS dense (733 sparse), GDDR6 864 GB/s, 48 GB",
        ),
        Hardware(
            "RTX3090",
            71 * _T,
            936 * _G,
            24 * _G,
            "NVIDIA Ampere GA102 GPU architecture whitepaper, GeForce RTX 3090: BF16 tensor with FP32 accumulate "
            "71 TFLOPS dense (142 sparse), GDDR6X 936 GB/s, 24 GB",
        ),
        Hardware(
            "MI300X",
            1307.4 * _T,
            5.3e12,
            192 * _G,
            "AMD Instinct MI300X datasheet: BF16 1,307.4 TFLOPS dense (2,614.9 sparse), HBM3 5.3 TB/s, 192 GB",
        ),
    )
}


def hardware(name: str) -> Hardware:
    """The table's entry by name (case-insensitive); a clear error listing the known names otherwise."""
    for key, h in HARDWARE.items():
        if key.lower() == name.lower().replace(" ", "").replace("-", ""):
            return h
    raise KeyError(f"unknown hardware {name!r}; known: {', '.join(HARDWARE)}")
