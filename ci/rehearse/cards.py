"""The machines a rehearsal pretends to be: each card as ``nvidia-smi`` shows it, and its speeds for the stand-in.

This table is the rehearsal's own, written from vendors' datasheets and recorded ``nvidia-smi`` output, not from
``helpers.sizing.HARDWARE`` (which is under test): a rehearsal that took the card from the code it rehearses would
agree with it by construction. Memory is what ``nvidia-smi --query-gpu=memory.total`` prints (MiB); bandwidth and
FLOP/s are dense datasheet peaks; ``achieved_*`` is the share of them a real engine reaches (one H200 measured
86% of its bandwidth in a copy and 77% of its bf16 peak in an 8192^3 matmul: ``shared/notes/h200-measured.md``).

A *machine* is some number of one card with a driver: :data:`MACHINES` names those ``make test`` rehearses.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

TB = 1e12


@dataclass(frozen=True)
class Card:
    """One NVIDIA card: what ``nvidia-smi`` reports and what the stand-in times steps with."""

    name: str                      # nvidia-smi's name, e.g. "NVIDIA H100 80GB HBM3"
    memory_mib: int                # nvidia-smi's memory.total
    compute_capability: tuple[int, int]
    bandwidth: float               # bytes/s
    bf16_flops: float | None       # dense tensor FLOP/s; None where the card has no bf16 (T4)
    fp16_flops: float
    fp8_flops: float | None = None
    fp4_flops: float | None = None
    int8_ops: float | None = None
    link: float = 64e9             # bytes/s between two cards (PCIe 4 x16 unless NVLink)
    clocks_sm: int = 1980
    clocks_mem: int = 2619
    power_w: float = 700.0
    source: str = ""

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 2**20


#: Datasheet figures; memory as recorded from nvidia-smi on such a card (or its datasheet's GB where no record
#: was found, as noted).
CARDS: dict[str, Card] = {c.name: c for c in (
    Card("Tesla T4", 15360, (7, 5), 320e9, None, 65 * TB, int8_ops=130 * TB, clocks_sm=1590, clocks_mem=5001,
         power_w=70, source="NVIDIA T4 datasheet; 15360 MiB as Colab's nvidia-smi prints it"),
    Card("NVIDIA L4", 23034, (8, 9), 300e9, 121 * TB, 121 * TB, 242 * TB, int8_ops=242 * TB, clocks_sm=2040,
         clocks_mem=6251, power_w=72, source="NVIDIA L4 datasheet"),
    Card("NVIDIA A10G", 23028, (8, 6), 600e9, 70 * TB, 70 * TB, int8_ops=140 * TB, clocks_sm=1710, clocks_mem=6251,
         power_w=300, source="AWS G5 (A10G): 24 GB GDDR6 at 600 GB/s; ~70 TFLOP/s dense bf16 (no datasheet)"),
    Card("NVIDIA A100-SXM4-40GB", 40960, (8, 0), 1555e9, 312 * TB, 312 * TB, int8_ops=624 * TB, link=300e9,
         clocks_sm=1410, clocks_mem=1215, power_w=400, source="NVIDIA A100 datasheet (40GB SXM)"),
    Card("NVIDIA A100-PCIE-40GB", 40960, (8, 0), 1555e9, 312 * TB, 312 * TB, int8_ops=624 * TB, clocks_sm=1410,
         clocks_mem=1215, power_w=250, source="NVIDIA A100 datasheet (40GB PCIe)"),
    Card("NVIDIA A100-SXM4-80GB", 81920, (8, 0), 2039e9, 312 * TB, 312 * TB, int8_ops=624 * TB, link=300e9,
         clocks_sm=1410, clocks_mem=1593, power_w=400, source="NVIDIA A100 datasheet (80GB SXM)"),
    Card("NVIDIA L40S", 46068, (8, 9), 864e9, 362 * TB, 362 * TB, 733 * TB, int8_ops=733 * TB, clocks_sm=2520,
         clocks_mem=9001, power_w=350, source="NVIDIA L40S datasheet"),
    Card("NVIDIA GeForce RTX 4090", 24564, (8, 9), 1008e9, 165 * TB, 165 * TB, 330 * TB, int8_ops=660 * TB,
         clocks_sm=3105, clocks_mem=10501, power_w=450,
         source="NVIDIA Ada whitepaper (RTX 4090: fp16/bf16 tensor with fp16 accumulate)"),
    Card("NVIDIA H100 PCIe", 81559, (9, 0), 2000e9, 756 * TB, 756 * TB, 1513 * TB, int8_ops=1513 * TB,
         clocks_sm=1755, clocks_mem=1593, power_w=350, source="NVIDIA H100 datasheet (PCIe)"),
    Card("NVIDIA H100 80GB HBM3", 81559, (9, 0), 3350e9, 989.5 * TB, 989.5 * TB, 1979 * TB, int8_ops=1979 * TB,
         link=450e9, clocks_sm=1980, clocks_mem=2619, power_w=700, source="NVIDIA H100 datasheet (SXM5)"),
    Card("NVIDIA H200", 143771, (9, 0), 4800e9, 989.5 * TB, 989.5 * TB, 1979 * TB, int8_ops=1979 * TB, link=450e9,
         clocks_sm=1980, clocks_mem=3201, power_w=700,
         source="NVIDIA H200 datasheet; 143771 MiB as recorded on one (shared/notes/h200-measured.md)"),
    Card("NVIDIA B200", 183359, (10, 0), 8000e9, 2250 * TB, 2250 * TB, 4500 * TB, 9000 * TB, int8_ops=4500 * TB,
         link=900e9, clocks_sm=1965, clocks_mem=3996, power_w=1000, source="NVIDIA DGX B200 datasheet (per GPU)"),
)}

#: The share of a datasheet peak a serving engine reaches (one H200: copy 86% of bandwidth, matmul 77% of bf16).
ACHIEVED_BANDWIDTH = 0.86
ACHIEVED_FLOPS = 0.70


@dataclass(frozen=True)
class Driver:
    """An NVIDIA driver as ``nvidia-smi`` reports it: its version and the newest CUDA it runs."""

    version: str
    cuda: str
    where: str


#: Drivers seen on the images learners use (their nvidia-smi banners): ``where`` says whose.
DRIVERS: dict[str, Driver] = {
    "colab-2024": Driver("550.54.15", "12.4", "Google Colab GPU runtimes, 2024-2025 (nvidia-smi banner, T4)"),
    "colab-2026": Driver("570.172.08", "12.8", "Google Colab GPU runtime with the CUDA 12.8 stack (2026)"),
    "runpod-12.8": Driver("570.124.06", "12.8", "RunPod PyTorch 2.8 / CUDA 12.8 images"),
    "lambda-12.8": Driver("570.133.20", "12.8", "Lambda Stack 22.04 / CUDA 12.8 instances"),
    "r580": Driver("580.159.04", "13.0", "the H200 this project measured on (2026-12-04)"),
}


@dataclass(frozen=True)
class Machine:
    """What a rehearsal pretends to run on: ``count`` of ``card`` under ``driver``."""

    key: str
    card: Card
    count: int = 1
    driver: Driver = DRIVERS["r580"]
    profile: str | None = None     # the profile the labs should pick on it (None: whatever helpers.runtime picks)
    why: str = ""

    def to_json(self) -> str:
        d = asdict(self)
        d["card"]["compute_capability"] = list(self.card.compute_capability)
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> "Machine":
        d = json.loads(text)
        card = d.pop("card")
        card["compute_capability"] = tuple(card["compute_capability"])
        return cls(card=Card(**card), driver=Driver(**d.pop("driver")), **d)


def card(name: str) -> Card:
    """A card by its nvidia-smi name, or by a word of it (``"h100"`` is the SXM card)."""
    if name in CARDS:
        return CARDS[name]
    short = {"t4": "Tesla T4", "l4": "NVIDIA L4", "a10g": "NVIDIA A10G", "a100": "NVIDIA A100-SXM4-80GB",
             "a100-40gb": "NVIDIA A100-SXM4-40GB", "h100": "NVIDIA H100 80GB HBM3", "h100-pcie": "NVIDIA H100 PCIe",
             "h200": "NVIDIA H200", "b200": "NVIDIA B200", "l40s": "NVIDIA L40S", "rtx4090": "NVIDIA GeForce RTX 4090"}
    if name.lower() in short:
        return CARDS[short[name.lower()]]
    raise KeyError(f"no card {name!r}: known {', '.join(CARDS)}")


#: What ``make test`` rehearses: every GPU profile on its own card, two cards the catalog does not name, and two
#: GPUs (lab 18's TP=2 path).
MACHINES: dict[str, Machine] = {m.key: m for m in (
    Machine("colab-t4", CARDS["Tesla T4"], driver=DRIVERS["colab-2026"], profile="colab-t4"),
    Machine("l4", CARDS["NVIDIA L4"], profile="l4"),
    Machine("a100", CARDS["NVIDIA A100-SXM4-80GB"], profile="a100"),
    Machine("h100", CARDS["NVIDIA H100 80GB HBM3"], profile="h100"),
    Machine("h200", CARDS["NVIDIA H200"], profile="h200"),
    Machine("b200", CARDS["NVIDIA B200"], profile="b200"),
    Machine("a100-40gb", CARDS["NVIDIA A100-SXM4-40GB"], driver=DRIVERS["colab-2026"],
            why="Colab's A100: an a100-class card with half the catalog's memory"),
    Machine("a10g", CARDS["NVIDIA A10G"], driver=DRIVERS["lambda-12.8"],
            why="a 24 GB card without FP8 (AWS G5), in no profile's name"),
    Machine("2xh100", CARDS["NVIDIA H100 80GB HBM3"], count=2, profile="h100",
            why="two GPUs: lab 18's tensor-parallel path, replicas on cards of their own"),
)}


# ``make test``'s share of the rehearsal: every lab once, each on the machine whose path through it no other machine
# takes, in runs of consecutive labs where one lab reads what the one before it saved. The whole matrix, every lab on
# every machine (``make rehearse``, about 15 minutes of both cores here), is more than make test's 60 minutes hold.
SAMPLE: dict[str, str] = {  # longest first (seconds each, six at a time here on 2026-12-07), so the longest starts first
    "a10g": "06-09,12",       # 158: a 24 GB card in no profile's name; lab 12 without FP8 kernels (SM86)
    "l4": "10-11",            # 118: the slowest card's load tests: the longest simulated runs
    "a100": "22-23",          # 121: routing, autoscaling and the postmortem with replicas at half an 80 GB card
    "a100-40gb": "20,24",     # 106: the fleet labs' model chosen on 40 GB (Colab's A100)
    "h200": "14-15",          # 83: six full-size builds and the gate at the second largest memory
    "h100": "16-17",          # 66: drafting and the cost search on the instructor's card
    "colab-t4": "01-05",      # 57: no bf16 (fp16), one prefill length in lab 05's calibration, no FP8 anywhere
    "2xh100": "18,21",        # 51: tensor parallel over two cards; offload with a card of its own per replica
    "b200": "13,19",          # 31: FP4 on Blackwell; experts on the card with the most memory
}


def machine(key: str, card_name: str | None = None, count: int | None = None) -> Machine:
    """A rehearsal machine: a key of :data:`MACHINES`, or a profile with another card (``card_name``)."""
    if card_name:
        base = MACHINES.get(key) or Machine(key, card(card_name))
        return replace(base, key=f"{key}@{card(card_name).name}", card=card(card_name), count=count or base.count)
    if key not in MACHINES:
        raise KeyError(f"no rehearsal machine {key!r}: known {', '.join(MACHINES)}")
    m = MACHINES[key]
    return replace(m, count=count) if count else m


# ------------------------------------------------------------------------------------------------ nvidia-smi
_FIELDS = {
    "name": lambda m, i: m.card.name,
    "memory.total": lambda m, i: str(m.card.memory_mib),
    "compute_cap": lambda m, i: "%d.%d" % m.card.compute_capability,
    "driver_version": lambda m, i: m.driver.version,
    "clocks.max.sm": lambda m, i: str(m.card.clocks_sm),
    "clocks.max.memory": lambda m, i: str(m.card.clocks_mem),
    "power.limit": lambda m, i: f"{m.card.power_w:.2f}",
    "index": lambda m, i: str(i),
    "uuid": lambda m, i: f"GPU-00000000-0000-0000-0000-{i:012d}",
    "pci.bus_id": lambda m, i: f"00000000:{0x18 + i:02X}:00.0",
}
_UNITS = {"memory.total": " MiB", "clocks.max.sm": " MHz", "clocks.max.memory": " MHz", "power.limit": " W"}


def nvidia_smi(m: Machine, argv: list[str]) -> tuple[int, str]:
    """What ``nvidia-smi argv`` prints on ``m`` (the forms the labs and the setup scripts use), and its exit code."""
    query = next((a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu=")), None)
    if query is not None:
        fmt = next((a.split("=", 1)[1] for a in argv if a.startswith("--format=")), "csv")
        names = [q.strip() for q in query.split(",")]
        unknown = [q for q in names if q not in _FIELDS]
        if unknown:
            return 2, f'Field "{unknown[0]}" is not a valid field to query.\n\n'
        rows = []
        if "noheader" not in fmt:
            rows.append(", ".join(f"{q}{' [MiB]' if q == 'memory.total' else ''}" for q in names))
        for i in range(m.count):
            rows.append(", ".join(_FIELDS[q](m, i) + ("" if "nounits" in fmt else _UNITS.get(q, ""))
                                  for q in names))
        return 0, "\n".join(rows) + "\n"
    if "-L" in argv:
        return 0, "".join(f"GPU {i}: {m.card.name} (UUID: {_FIELDS['uuid'](m, i)})\n" for i in range(m.count))
    # The banner: the lines scripts/check_env.py and helpers.provenance read ("Driver Version", "CUDA Version").
    head = (f"+-----------------------------------------------------------------------------------------+\n"
            f"| NVIDIA-SMI {m.driver.version:<16} Driver Version: {m.driver.version:<16} "
            f"CUDA Version: {m.driver.cuda:<9}|\n"
            f"|-----------------------------------------+------------------------+----------------------+\n")
    gpus = "".join(f"|   {i}  {m.card.name[:30]:<30} On  | {_FIELDS['pci.bus_id'](m, i)[4:]} Off |"
                   f"   0MiB / {m.card.memory_mib}MiB |\n" for i in range(m.count))
    return 0, head + gpus


def describe(m: Machine) -> dict[str, Any]:
    return {"machine": m.key, "card": m.card.name, "count": m.count, "memory_mib": m.card.memory_mib,
            "compute_capability": "%d.%d" % m.card.compute_capability, "driver": m.driver.version,
            "cuda": m.driver.cuda}


__all__ = ["Card", "CARDS", "Driver", "DRIVERS", "Machine", "MACHINES", "machine", "card", "nvidia_smi", "describe",
           "ACHIEVED_BANDWIDTH", "ACHIEVED_FLOPS", "field"]
