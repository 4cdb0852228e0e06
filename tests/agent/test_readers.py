"""The agent's readers on real samples: sysfs fixture trees (node_exporter, procfs),
nvidia-smi output captured on H100/H200/L40S, and NVML faked at the pynvml boundary."""
from __future__ import annotations

import os
from pathlib import Path

import pynvml
import pytest

from agent import hostinfo, nvidia_smi, nvml, sysfs
from agent.protocol import parse_report
from agent.report import Collector, GpuReadError
from tests.agent import ttar
from tests.conftest import DATA

# ----------------------------------------------------------------- sysfs: IB ports


@pytest.fixture
def node_exporter_sys(tmp_path):
    """node_exporter's fixture: an iWARP NIC without PMA (i40iw0) and a 2-port QDR mlx4_0."""
    ttar.extract(DATA / "sysfs_infiniband_node_exporter_fixture.ttar", tmp_path)
    return tmp_path / "sys"


@pytest.fixture
def procfs_sys(tmp_path):
    """procfs' fixture: Omni-Path hfi1_0 with 64-bit counters, mlx4_0, mlx5_0 with a node GUID."""
    ttar.extract(DATA / "sysfs_infiniband_procfs_fixture.ttar", tmp_path)
    return tmp_path / "fixtures" / "sys"


def _port(ports, device, number):
    return next(p for p in ports if p["device"] == device and p["port"] == number)


def test_ib_ports_from_node_exporter_tree(node_exporter_sys):
    ports = sysfs.read_ib_ports(node_exporter_sys)
    assert [(p["device"], p["port"]) for p in ports] == [("i40iw0", 1), ("mlx4_0", 1), ("mlx4_0", 2)]

    mlx4 = _port(ports, "mlx4_0", 1)
    assert (mlx4["state"], mlx4["phys_state"], mlx4["rate_gbps"], mlx4["link_layer"]) == ("ACTIVE", "LinkUp", 40.0, "InfiniBand")
    # data counters count 4-byte words: node_exporter reports 1.8527668e+07 received bytes for 4631917
    assert mlx4["counters"]["port_rcv_data_bytes"] == 18527668
    assert mlx4["counters"]["port_xmit_data_bytes"] == 3733440 * 4
    assert mlx4["counters"]["port_xmit_packets"] == 6235865
    assert mlx4["counters"]["port_xmit_discards"] == 5
    # port_xmit_wait sits at 2^32-1: saturated, so unknown rather than a frozen huge number
    assert "port_xmit_wait" not in mlx4["counters"]

    # "N/A (no PMA)" in every counter file: the port is reported, without counters
    i40iw = _port(ports, "i40iw0", 1)
    assert i40iw["counters"] == {}
    assert i40iw["rate_gbps"] == 10.0

    # mlx4_0 port 2's link_layer file has a trailing blank line
    assert _port(ports, "mlx4_0", 2)["link_layer"] == "InfiniBand"


def test_ib_ports_from_procfs_tree(procfs_sys):
    ports = sysfs.read_ib_ports(procfs_sys)
    assert {(p["device"], p["port"]) for p in ports} == {("hfi1_0", 1), ("mlx4_0", 1), ("mlx4_0", 2), ("mlx5_0", 1)}
    hfi = _port(ports, "hfi1_0", 1)
    assert hfi["rate_gbps"] == 100.0
    assert hfi["counters"]["port_rcv_data_bytes"] == 345091702026 * 4  # 64-bit counter, not saturated
    mlx5 = _port(ports, "mlx5_0", 1)
    assert mlx5["node_guid"] == "0x0a7fbc1245efd23b"  # "0a7f:bc12:45ef:d23b", file without newline
    assert mlx5["rate_gbps"] == 25.0
    assert _port(ports, "hfi1_0", 1)["node_guid"] == ""  # no node_guid file there


def test_saturated_data_counter_falls_back_to_the_64_bit_copy(node_exporter_sys):
    port = node_exporter_sys / "class/infiniband/mlx4_0/ports/1"
    (port / "counters/port_rcv_data").write_text("4294967295\n")
    (port / "lid").write_text("0x1a\n")
    mlx4 = _port(sysfs.read_ib_ports(node_exporter_sys), "mlx4_0", 1)
    assert mlx4["counters"]["port_rcv_data_bytes"] == 4631917 * 4  # from counters_ext/port_rcv_data_64
    assert mlx4["lid"] == 26


def test_ports_of_real_trees_pass_the_protocol(node_exporter_sys, procfs_sys):
    for root in (node_exporter_sys, procfs_sys):
        collector = Collector("gpu001", sysfs_root=root, read_gpus=list)
        report = parse_report(collector.build([]))
        assert report["ib_ports"] and all(p["state"] == "ACTIVE" for p in report["ib_ports"])


def test_no_infiniband_class_means_no_ports(tmp_path):
    assert sysfs.read_ib_ports(tmp_path) == []


@pytest.mark.parametrize("text, gbps", [
    ("400 Gb/sec (4X NDR)", 400.0), ("2.5 Gb/sec (1X SDR)", 2.5), ("10 Gb/sec (4X)", 10.0), ("garbage", None), (None, None)])
def test_rate_text(text, gbps):
    assert sysfs.parse_rate(text) == gbps


# ----------------------------------------------------------------- sysfs: nearest HCA


def _pci_device(root: Path, chain: str, numa: int | None) -> Path:
    path = root / "devices" / chain
    path.mkdir(parents=True)
    if numa is not None:
        (path / "numa_node").write_text(f"{numa}\n")
    return path


def _gpu(root: Path, chain: str, numa: int | None = None) -> None:
    path = _pci_device(root, chain, numa)
    link = root / "bus/pci/devices" / path.name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(path, link.parent))


def _hca(root: Path, name: str, chain: str, numa: int | None = None) -> None:
    path = _pci_device(root, chain, numa)
    device_dir = root / "class/infiniband" / name
    device_dir.mkdir(parents=True)
    (device_dir / "device").symlink_to(os.path.relpath(path, device_dir))


@pytest.fixture
def two_socket_tree(tmp_path):
    r"""A two-socket host, as sysfs shows it (realpaths under /sys/devices):

        socket 0 (NUMA 0)                           socket 1 (NUMA 1)
        root port 00:01.0      root port 00:02.0    root port 80:01.0   80:03.0       c0:01.0 (NUMA 2)
            switch 01:00.0         switch 05:00.0       GPU 81:00.0      mlx5_2         GPU c1:00.0
            /        \            /       \                              82:00.0
        GPU 03:00.0  mlx5_0   GPU 07:00.0  mlx5_1 (08:00.0, and
        (02:00.0)   04:00.0   (06:00.0)    mlx5_3 = function .1)
    """
    root = tmp_path / "sys"
    _gpu(root, "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0", 0)
    _hca(root, "mlx5_0", "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0", 0)
    _gpu(root, "pci0000:00/0000:00:02.0/0000:05:00.0/0000:06:00.0/0000:07:00.0", 0)
    _hca(root, "mlx5_1", "pci0000:00/0000:00:02.0/0000:05:00.0/0000:06:01.0/0000:08:00.0", 0)
    _hca(root, "mlx5_3", "pci0000:00/0000:00:02.0/0000:05:00.0/0000:06:01.0/0000:08:00.1", 0)
    _gpu(root, "pci0000:80/0000:80:01.0/0000:81:00.0", 1)
    _hca(root, "mlx5_2", "pci0000:80/0000:80:03.0/0000:82:00.0", 1)
    _gpu(root, "pci0000:c0/0000:c0:01.0/0000:c1:00.0", -1)
    return root


def test_nearest_hca_by_pcie_switch_then_numa_node(two_socket_tree):
    found = sysfs.nearest_hcas(
        ["00000000:03:00.0", "00000000:07:00.0", "00000000:81:00.0", "00000000:C1:00.0", "00000000:99:00.0"],
        two_socket_tree)
    assert found["00000000:03:00.0"] == {"nearest_hca": "mlx5_0", "numa_node": 0}  # same switch
    # same switch as two functions of one card: the first name, every time
    assert found["00000000:07:00.0"]["nearest_hca"] == "mlx5_1"
    # no HCA behind its root port: the HCA of its NUMA node, not the ones on socket 0
    assert found["00000000:81:00.0"] == {"nearest_hca": "mlx5_2", "numa_node": 1}
    # numa_node -1 (unknown) and nothing shared: none, rather than a guess
    assert found["00000000:C1:00.0"] == {"nearest_hca": "", "numa_node": None}
    assert found["00000000:99:00.0"] == {"nearest_hca": "", "numa_node": None}  # not in sysfs


def test_pick_nearest_is_a_pure_function_of_paths():
    hcas = {"mlx5_0": (Path("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0"), 0),
            "mlx5_9": (Path("/sys/devices/pci0000:00/0000:00:01.0/0000:0a:00.0"), 0)}
    gpu = Path("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0")
    assert sysfs.pick_nearest(gpu, 0, hcas) == "mlx5_0"  # deeper shared bridge wins over the root port
    assert sysfs.pick_nearest(None, 0, hcas) == "mlx5_0"  # NUMA only
    assert sysfs.pick_nearest(None, None, hcas) == ""


# ----------------------------------------------------------------- nvidia-smi


def _smi(name: str) -> str:
    return (DATA / name).read_text()


def test_query_fields_exist_in_real_drivers():
    """nvidia-smi refuses a query with one unknown field: every field we ask for is in the
    field list of the 590 (H100) and 595 (L40S) drivers' captured output."""
    for name in ("nvidia-smi_query-gpu_h100-80gb-hbm3_load_590.48.01.csv", "nvidia-smi_query-gpu_l40s_load_595.80.csv"):
        header = [field.split(" [")[0].strip() for field in _smi(name).splitlines()[0].split(",")]
        assert set(nvidia_smi.QUERY_FIELDS) <= set(header), name


def test_nvidia_smi_csv_h100_under_load():
    [gpu] = nvidia_smi.parse_query_gpu(_smi("nvidia-smi_query-gpu_h100-80gb-hbm3_load_590.48.01.csv"), fields=None)
    assert gpu["model"] == "NVIDIA H100 80GB HBM3"
    assert gpu["uuid"] == "GPU-00000000-0000-0000-0000-000000000000"
    assert (gpu["memory_total_mib"], gpu["memory_used_mib"]) == (81559, 19818)
    assert (gpu["utilization_pct"], gpu["temperature_c"]) == (100, 59)
    assert (gpu["power_w"], gpu["power_limit_w"]) == (631.95, 700.0)
    assert (gpu["compute_capability"], gpu["pci_bus_id"], gpu["mig_mode"]) == ("9.0", "00000000:00:09.0", False)
    assert (gpu["ecc_corrected"], gpu["ecc_uncorrected"]) == (0, 0)


def test_nvidia_smi_csv_mig_gpu_has_no_utilization():
    [gpu] = nvidia_smi.parse_query_gpu(_smi("nvidia-smi_query-gpu_h100-mig_load_590.48.01.csv"), fields=None)
    assert gpu["utilization_pct"] is None  # "[N/A]" on a MIG-enabled GPU
    assert gpu["mig_mode"] is True
    assert gpu["memory_used_mib"] == 11125


def test_nvidia_smi_csv_h200_and_l40s():
    [h200] = nvidia_smi.parse_query_gpu(_smi("nvidia-smi_query-gpu_h200_idle_590.48.01.csv"), fields=None)
    assert (h200["model"], h200["memory_total_mib"], h200["utilization_pct"], h200["power_w"]) == ("NVIDIA H200", 143771, 0, 77.71)
    [l40s] = nvidia_smi.parse_query_gpu(_smi("nvidia-smi_query-gpu_l40s_load_595.80.csv"), fields=None)
    assert (l40s["compute_capability"], l40s["mig_mode"], l40s["power_limit_w"]) == ("8.9", False, 350.0)  # mig "[N/A]"


def test_nvidia_smi_list_gives_mig_instances():
    instances = nvidia_smi.parse_list(_smi("nvidia-smi-L_h100-mig_590.48.01.txt"))
    assert [m["profile"] for m in instances["GPU-00000000-0000-0000-0000-000000000000"]] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert instances["GPU-00000000-0000-0000-0000-000000000000"][1]["uuid"] == "MIG-00000001-0000-0000-0000-000000000001"


def test_nvidia_smi_rows_that_do_not_match_the_fields_are_refused():
    with pytest.raises(nvidia_smi.NvidiaSmiError, match="row 1: 3 values for 14 fields"):
        nvidia_smi.parse_query_gpu("0, GPU-1, H100\n")


# One row as `--query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits` prints it, with the
# values of the captured H100 MIG GPU.
H100_MIG_ROW = ("0, GPU-00000000-0000-0000-0000-000000000000, NVIDIA H100 80GB HBM3, 81559, 11125, [N/A], 53, "
                "433.78, 700.00, 00000000:00:09.0, 9.0, Enabled, 0, 0\n")


@pytest.fixture
def fake_nvidia_smi(tmp_path, monkeypatch):
    """An `nvidia-smi` on PATH that answers like the captured H100 with MIG."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "row.csv").write_text(H100_MIG_ROW)
    script = bindir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-L" ]; then cat "{DATA / "nvidia-smi-L_h100-mig_590.48.01.txt"}"; exit 0; fi\n'
        f'case "$1" in --query-gpu=*) cat "{tmp_path / "row.csv"}";; *) echo "bad args" >&2; exit 2;; esac\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return script


def _no_nvml(monkeypatch):
    def init():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    monkeypatch.setattr(nvml, "_init_pid", None)
    monkeypatch.setattr(pynvml, "nvmlInit", init)


def test_without_nvml_the_collector_falls_back_to_nvidia_smi(fake_nvidia_smi, monkeypatch, caplog):
    _no_nvml(monkeypatch)
    collector = Collector("gpu001", sysfs_root=fake_nvidia_smi.parent, gpu_source="auto")
    report = parse_report(collector.build([]))
    [gpu] = report["gpus"]
    assert gpu["mig_mode"] and [m["profile"] for m in gpu["mig_instances"]] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert gpu["power_w"] == 433.78
    assert "NVML Shared Library Not Found; reading GPUs with nvidia-smi" in caplog.text


def test_failing_nvidia_smi_is_an_error_not_an_empty_host(fake_nvidia_smi, monkeypatch):
    _no_nvml(monkeypatch)
    fake_nvidia_smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'\nexit 9\n")
    with pytest.raises(GpuReadError, match="exited with 9: NVIDIA-SMI has failed"):
        Collector("gpu001", sysfs_root=fake_nvidia_smi.parent).gpus()


def test_no_nvml_and_no_nvidia_smi_means_no_gpus(monkeypatch, tmp_path):
    _no_nvml(monkeypatch)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert Collector("cpu-node", sysfs_root=tmp_path).gpus() == []


# ----------------------------------------------------------------- NVML at the pynvml boundary

GIB = 2**30
MIB = 2**20


class FakeNvml:
    """pynvml's functions for a host with: an H100 (idle-ish), an H100 in MIG mode with the
    four instances of the captured H100-MIG machine, a GPU that falls off the bus after
    its UUID was read, and a GPU that refuses power and ECC (no permission / not supported)."""

    def __init__(self):
        self.init_calls = 0
        h100_total = 81559 * MIB
        self.gpus = [
            {"uuid": "GPU-0a", "name": "NVIDIA H100 80GB HBM3", "total": h100_total, "used": 19818 * MIB, "util": 100,
             "temp": 59, "power": 631950, "limit": 700000, "ecc": (0, 0), "bus": b"00000000:03:00.0", "numa": 0, "mig": None},
            {"uuid": "GPU-1m", "name": "NVIDIA H100 80GB HBM3", "total": h100_total, "used": 11125 * MIB, "util": None,
             "temp": 53, "power": 433780, "limit": 700000, "ecc": (2, 0), "bus": b"00000000:07:00.0", "numa": 0,
             "mig": {0: ("MIG-2", 2, 3, 40448, 11091), 1: ("MIG-3", 3, 2, 20096, 17), 4: ("MIG-9", 9, 1, 9984, 9),
                     5: ("MIG-10", 10, 1, 9984, 9)}},
            {"uuid": "GPU-2lost", "lost": True, "bus": b"00000000:81:00.0"},
            {"uuid": "GPU-3", "name": "NVIDIA L40S", "total": 46068 * MIB, "used": 1235 * MIB, "util": 9, "temp": 54,
             "power": "noperm", "limit": 350000, "ecc": None, "bus": b"00000000:C1:00.0", "numa": None, "mig": None},
        ]

    def install(self, monkeypatch):
        monkeypatch.setattr(nvml, "_init_pid", None)
        monkeypatch.setattr(nvml, "_known_uuids", {})
        for name in dir(self):
            if name.startswith("nvml"):
                monkeypatch.setattr(pynvml, name, getattr(self, name))

    def _gpu(self, handle):
        return self.gpus[handle[1]]

    def _mig(self, handle):
        return self._gpu(handle)["mig"][handle[2]]

    def _check(self, handle, lost_ok=False):
        if self._gpu(handle).get("lost") and not lost_ok:
            raise pynvml.NVMLError_GpuIsLost()

    def nvmlInit(self):
        self.init_calls += 1

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("gpu", index)

    def nvmlDeviceGetUUID(self, handle):
        return self._mig(handle)[0] if handle[0] == "mig" else self._gpu(handle)["uuid"]

    def nvmlDeviceGetName(self, handle):
        self._check(handle)
        return self._gpu(handle)["name"]

    def nvmlDeviceGetMemoryInfo(self, handle):
        self._check(handle)
        if handle[0] == "mig":
            _, _, _, total, used = self._mig(handle)
            return pynvml.c_nvmlMemory_t(total=total * MIB, free=(total - used) * MIB, used=used * MIB)
        gpu = self._gpu(handle)
        return pynvml.c_nvmlMemory_t(total=gpu["total"], free=gpu["total"] - gpu["used"], used=gpu["used"])

    def nvmlDeviceGetUtilizationRates(self, handle):
        self._check(handle)
        if self._gpu(handle)["util"] is None:
            raise pynvml.NVMLError_NotSupported()  # what a MIG-enabled GPU answers
        return pynvml.c_nvmlUtilization_t(gpu=self._gpu(handle)["util"], memory=10)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        self._check(handle)
        return self._gpu(handle)["temp"]

    def nvmlDeviceGetPowerUsage(self, handle):
        self._check(handle)
        if self._gpu(handle)["power"] == "noperm":
            raise pynvml.NVMLError_NoPermission()
        return self._gpu(handle)["power"]

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        self._check(handle)
        return self._gpu(handle)["limit"]

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type, counter_type):
        self._check(handle)
        assert counter_type == pynvml.NVML_VOLATILE_ECC
        if self._gpu(handle)["ecc"] is None:
            raise pynvml.NVMLError_NotSupported()
        return self._gpu(handle)["ecc"][error_type]

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        self._check(handle)
        return (8, 9) if "L40S" in self._gpu(handle)["name"] else (9, 0)

    def nvmlDeviceGetPciInfo(self, handle):
        self._check(handle, lost_ok=True)
        return pynvml.nvmlPciInfo_t(busId=self._gpu(handle)["bus"])

    def nvmlDeviceGetNumaNodeId(self, handle):
        self._check(handle)
        if self._gpu(handle)["numa"] is None:
            raise pynvml.NVMLError_NotSupported()
        return self._gpu(handle)["numa"]

    def nvmlDeviceGetMigMode(self, handle):
        self._check(handle)
        return [1, 1] if self._gpu(handle)["mig"] else [0, 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, slot):
        if slot not in self._gpu(handle)["mig"]:
            raise pynvml.NVMLError_NotFound()
        return ("mig", handle[1], slot)

    def nvmlDeviceGetGpuInstanceId(self, handle):
        return self._mig(handle)[1]

    def nvmlDeviceGetAttributes(self, handle):
        _, _, slices, memory, _ = self._mig(handle)
        return pynvml.c_nvmlDeviceAttributes(gpuInstanceSliceCount=slices, computeInstanceSliceCount=slices, memorySizeMB=memory)


@pytest.fixture
def fake_nvml(monkeypatch):
    fake = FakeNvml()
    fake.install(monkeypatch)
    return fake


def test_nvml_reads_units_and_mig(fake_nvml):
    gpus = nvml.read_gpus()
    h100, mig, lost, l40s = gpus
    assert h100["uuid"] == "GPU-0a" and h100["model"] == "NVIDIA H100 80GB HBM3"
    assert (h100["memory_total_mib"], h100["memory_used_mib"]) == (81559, 19818)  # bytes -> MiB
    assert (h100["power_w"], h100["power_limit_w"]) == (631.95, 700.0)  # mW -> W
    assert (h100["utilization_pct"], h100["temperature_c"], h100["compute_capability"]) == (100, 59, "9.0")
    assert (h100["pci_bus_id"], h100["numa_node"], h100["mig_mode"]) == ("00000000:03:00.0", 0, False)

    assert mig["utilization_pct"] is None and mig["mig_mode"] is True and mig["ecc_corrected"] == 2
    # profiles rebuilt from attributes match what `nvidia-smi -L` printed on the same machine
    assert [(m["uuid"], m["gpu_instance_id"], m["profile"], m["memory_total_mib"]) for m in mig["mig_instances"]] == [
        ("MIG-2", 2, "3g.40gb", 40448), ("MIG-3", 3, "2g.20gb", 20096), ("MIG-9", 9, "1g.10gb", 9984), ("MIG-10", 10, "1g.10gb", 9984)]
    assert mig["mig_instances"][0]["memory_used_mib"] == 11091

    # NoPermission / NotSupported: those fields only are unknown
    assert (l40s["power_w"], l40s["ecc_corrected"], l40s["numa_node"]) == (None, None, None)
    assert (l40s["power_limit_w"], l40s["utilization_pct"], l40s["compute_capability"]) == (350.0, 9, "8.9")

    # lost: reported, with its UUID and the reason, and nothing made up
    assert lost["uuid"] == "GPU-2lost" and lost["error"] == "GPU 2 is lost: GPU is lost"
    assert lost["memory_total_mib"] is None and lost["model"] == ""


def test_nvml_is_initialised_once_per_process(fake_nvml):
    nvml.read_gpus()
    nvml.read_gpus()
    assert fake_nvml.init_calls == 1


def test_report_from_nvml_and_sysfs_passes_the_protocol(fake_nvml, two_socket_tree):
    collector = Collector("gpu001", sysfs_root=two_socket_tree, gpu_source="nvml")
    report = parse_report(collector.build([]))
    assert report["host"] == "gpu001"
    by_uuid = {g["uuid"]: g for g in report["gpus"]}
    assert by_uuid["GPU-0a"]["nearest_hca"] == "mlx5_0"
    assert by_uuid["GPU-1m"]["nearest_hca"] == "mlx5_1"
    assert by_uuid["GPU-2lost"]["nearest_hca"] == "mlx5_2"  # the bus id still tells where it sits
    assert by_uuid["GPU-2lost"]["error"]
    assert by_uuid["GPU-3"]["numa_node"] is None  # NVML did not say and sysfs says -1


def test_gpu_source_nvml_without_nvml_is_an_error(monkeypatch, tmp_path):
    _no_nvml(monkeypatch)
    with pytest.raises(GpuReadError, match="NVML unavailable"):
        Collector("gpu001", sysfs_root=tmp_path, gpu_source="nvml").gpus()


@pytest.mark.parametrize("slices, memory, total_mib, profile", [
    (1, 9984, 81559, "1g.10gb"), (3, 40448, 81559, "3g.40gb"), (7, 80384, 81559, "7g.80gb"),  # H100 80GB
    (1, 4864, 40536, "1g.5gb"), (7, 40192, 40536, "7g.40gb"),  # A100 40GB
])
def test_mig_profile_names(slices, memory, total_mib, profile):
    assert nvml.mig_profile(slices, memory, total_mib * MIB) == profile


# ----------------------------------------------------------------- host


def test_host_figures_are_sane():
    hostinfo.prime()
    host = hostinfo.read_host()
    assert host["cpu"]["count"] >= 1 and 0 <= host["cpu"]["percent"] <= 100
    assert 0 < host["memory"]["used_mib"] <= host["memory"]["total_mib"]
