"""dcgm-exporter and node_exporter text, from real scrapes, mapped onto the report's fields."""
import re

import pytest

from agent.protocol import parse_report
from pool import prometheus
from tests.conftest import read_sample


def dcgm(name):
    return prometheus.parse_dcgm(read_sample(f"dcgm-exporter_metrics-{name}.prom").decode())


def fields(gpu, *names):
    return tuple(gpu[n] for n in names)


NUMBERS = ("model", "utilization_pct", "memory_used_mib", "memory_total_mib", "temperature_c", "power_w")


@pytest.mark.parametrize("name, expected", [
    # total = FB_FREE + FB_USED + FB_RESERVED
    ("L4-kops-aws", ("NVIDIA L4", 0.0, 0.0, 23033.0, 31.0, 16.365)),
    ("L40S-upcloud", ("NVIDIA L40S", 0.0, 0.0, 46067.0, 32.0, 35.686)),
    ("T4-ericsson", ("Tesla T4", 91.0, 5120.0, 15358.0, 74.0, 68.244)),  # no HELP/TYPE lines at all
    ("T4-rafay", ("Tesla T4", 0.0, 0.0, 15359.0, 24.0, 14.512)),
    # a vGPU guest has no power or temperature series: unknown, not 0
    ("A100-40C-vgpu-vks", ("GRID A100-40C", 0.0, 0.0, 40959.0, None, None)),
])
def test_one_gpu_scrapes(name, expected):
    parsed = dcgm(name)
    [gpu] = parsed["gpus"]
    assert fields(gpu, *NUMBERS) == expected
    assert gpu["uuid"].startswith("GPU-") and gpu["index"] == 0 and not gpu["mig_mode"]
    assert parsed["hostname"]


def test_labels_identify_the_gpu_and_host():
    parsed = dcgm("L4-kops-aws")
    gpu = parsed["gpus"][0]
    assert (gpu["uuid"], gpu["pci_bus_id"]) == ("GPU-c2f76b33-7953-256e-8f33-1343419b1a1c", "00000000:31:00.0")
    assert (parsed["hostname"], parsed["driver"]) == ("i-030791dc5a37cd257", "580.105.08")


def test_mig_instances_are_grouped_under_their_gpu():
    [gpu] = dcgm("MIG-H100-excerpt-dcgm-exporter-issue512")["gpus"]
    assert gpu["mig_mode"] is True
    assert [(m["gpu_instance_id"], m["profile"]) for m in gpu["mig_instances"]] == [(7, "1g.10gb"), (8, "1g.10gb"), (9, "1g.10gb")]
    assert gpu["utilization_pct"] == 0.0  # engine-active ratio of the instances, as percent (no GPU_UTIL under MIG)

    [a100] = dcgm("MIG-A100-excerpt-dra-driver-issue166")["gpus"]
    assert a100["utilization_pct"] == pytest.approx(100 * (0.029399 + 0.033893 + 0.0) / 3)


def test_mig_memory_is_the_sum_of_the_instances_and_gpus_are_told_apart_by_uuid():
    gpus = dcgm("MIG-A30-excerpt-dcgm-exporter-issue317")["gpus"]
    assert [(g["index"], g["uuid"], len(g["mig_instances"]), g["memory_used_mib"]) for g in gpus] == [
        (0, "GPU-265c9814-6156-355b-e589-ff2064894f16", 4, 12.0),
        (1, "GPU-2d20791a-b4a6-ba59-97f1-e95b99fe5b49", 2, 6.0),
    ]
    assert gpus[0]["memory_total_mib"] is None  # instances do not cover the whole GPU
    assert gpus[0]["pci_bus_id"] == ""  # older exporters have no pci_bus_id label


def test_blank_sentinels_are_missing_values_and_new_label_spellings_work():
    text = (
        '# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="1",uuid="GPU-x",modelName="NVIDIA H100 80GB HBM3",hostname="n1"} 9223372036854775794\n'
        '# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n'
        'DCGM_FI_DEV_POWER_USAGE{gpu="1",uuid="GPU-x",modelName="NVIDIA H100 80GB HBM3",hostname="n1"} 140737488355330.0\n'
        '# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="1",uuid="GPU-x",modelName="NVIDIA H100 80GB HBM3",hostname="n1"} 42\n'
        '# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter\n'
        'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="1",uuid="GPU-x",modelName="NVIDIA H100 80GB HBM3",hostname="n1"} 2\n'
    )
    parsed = prometheus.parse_dcgm(text)
    [gpu] = parsed["gpus"]
    assert (gpu["index"], gpu["uuid"], gpu["temperature_c"], gpu["power_w"], gpu["utilization_pct"], gpu["ecc_uncorrected"]) == (
        1, "GPU-x", None, None, 42.0, 2)
    assert parsed["hostname"] == "n1"


@pytest.mark.parametrize("text, message", [
    ("", "no DCGM_FI_* series"),
    ("node_load1 0.5\n", "no DCGM_FI_* series"),
    ('DCGM_FI_DEV_GPU_UTIL{gpu="0"} 1\n', "no DCGM_FI_* series with a GPU UUID label"),
    ("DCGM_FI_DEV_GPU_UTIL{gpu=0} 1\n", "not Prometheus text"),
])
def test_pages_that_are_not_dcgm_are_refused(text, message):
    with pytest.raises(prometheus.ExporterError, match=re.escape(message)):
        prometheus.parse_dcgm(text)


def test_node_exporter_infiniband_ports():
    parsed = prometheus.parse_node_exporter(read_sample("node-exporter_e2e-output_infiniband.prom").decode())
    ports = {(p["device"], p["port"]): p for p in parsed["ib_ports"]}
    assert sorted(ports) == [("i40iw0", 1), ("mlx4_0", 1), ("mlx4_0", 2)]
    port = ports[("mlx4_0", 1)]
    assert (port["state"], port["phys_state"], port["rate_gbps"]) == ("ACTIVE", "LinkUp", 40.0)
    assert port["counters"]["port_rcv_data_bytes"] == 18527668  # already bytes (node_exporter multiplied by 4)
    assert port["counters"]["port_xmit_discards"] == 5
    assert "port_xmit_wait" not in port["counters"]  # pinned at 2^32-1: says nothing
    # port 2's 32-bit data counters read 0; mlx4's 64-bit legacy copies hold the traffic
    assert ports[("mlx4_0", 2)]["counters"]["port_rcv_data_bytes"] == 18527668
    assert ports[("i40iw0", 1)]["counters"] == {}  # no PMA: state and rate only


def test_exporter_reports_pass_the_report_schema():
    report = prometheus.report_from_exporters(
        "gpu0001", dcgm_text=read_sample("dcgm-exporter_metrics-T4-rafay.prom").decode(),
        node_text=read_sample("node-exporter_e2e-output_infiniband.prom").decode(), now=1_800_000_000.0)
    parsed = parse_report(report)
    assert parsed["host"] == "gpu0001"
    assert parsed["agent_version"] == "dcgm-exporter, driver 580.105.08"
    assert len(parsed["gpus"]) == 1 and len(parsed["ib_ports"]) == 3
    assert parsed["allocations"] == []
