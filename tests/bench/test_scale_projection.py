"""The scale projection's arithmetic on a hand-made bench result, and its measurements on the real dump."""

import os

import pytest

from bench.scale_projection import DEFAULT_DUMP, measure_dump, project, read_sites, table


def _bench(us_per_post: float = 400.0) -> dict:
    profile = {
        "read, text, language": {"us_per_post": us_per_post * 0.75, "share": 0.75},
        "threads": {"us_per_post": us_per_post * 0.25, "share": 0.25},
        "  read": {"us_per_post": 99.0, "share": 0.1, "one_process_us_per_post": 50.0},
    }
    return {
        "details": {
            "machine": {"num_cpus_used": 2},
            "sizes": {
                "100000": {"posts": 100_000, "xml_mb": 100.0, "ours": {"peak_heap_mb": 1000}, "stage_profile": {}},
                "1000000": {
                    "posts": 1_000_000,
                    "xml_mb": 1000.0,
                    "ours": {"peak_heap_mb": 2048},
                    "stage_profile": profile,
                },
            },
        }
    }


MEASURED = {"analysed_bytes_per_post": 1024.0, "lzma_decode_mb_per_s": 100.0, "lzma_ratio": 5.0, "posts": 10}


def test_time_divides_by_cores_and_the_largest_archive_decodes_on_one_core():
    sites = {"big.example": 60_000_000, "small.example": 20_000_000}
    p = project(_bench(), MEASURED, sites, [16, 64])
    # Sub-rows (indented) split the first stage and are not counted twice.
    assert p["cpu_us_per_post"] == pytest.approx(400.0)
    sixteen, sixty_four = p["rows"]
    assert sixteen["build_hours"] == pytest.approx(80e6 * 400e-6 / 16 / 3600)
    assert sixty_four["build_hours"] == pytest.approx(sixteen["build_hours"] / 4)
    # 60M posts x 1,048.576 B of XML each, decoded at 100 MB/s on one core, whatever the core count.
    decode = 60e6 * 1000 * 2**20 / 1e6 / 2**20 / 100 / 3600
    assert sixteen["decode_hours"] == sixty_four["decode_hours"] == pytest.approx(decode)
    assert sixteen["hours"] == pytest.approx(decode + sixteen["build_hours"])
    assert (sixteen["nodes"], sixty_four["nodes"]) == (1, 4)
    assert sixteen["dollars"] == pytest.approx(sixteen["hours"] * 0.77)
    # Heaps per CPU from the largest size (2 GB over 2 CPUs) plus the object store's share of a 64 GiB node.
    assert sixteen["memory_gb_per_cpu"] == pytest.approx(1.0 + 64 * 0.3 / 16)
    # 80M analysed posts of 1 KiB: 76.3 GiB through the shuffles; one node's store holds 19.2 GiB, four 76.8.
    assert sixteen["spill_gb"] == pytest.approx(80e6 / 2**20 - 19.2)
    assert sixty_four["spill_gb"] == 0.0
    assert "| 16 (1) |" in table(p)


def test_sites_csv_is_read_and_bad_rows_name_the_line(tmp_path):
    good = tmp_path / "sites.csv"
    good.write_text("site,posts\nbeer.stackexchange.com,2235\nmath.stackexchange.com,4000000\n")
    assert read_sites(str(good)) == {"beer.stackexchange.com": 2235, "math.stackexchange.com": 4_000_000}
    bad = tmp_path / "bad.csv"
    bad.write_text("site,posts\nbeer.stackexchange.com,2235\nmath.stackexchange.com,many\n")
    with pytest.raises(SystemExit, match=r"bad\.csv: line 3"):
        read_sites(str(bad))


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(DEFAULT_DUMP), reason="../shared/data/stackexchange_dump_beer is absent")
def test_measurements_on_the_real_dump():
    m = measure_dump(DEFAULT_DUMP)
    assert m["posts"] == 663 + 1572  # questions and answers, per the data's PROVENANCE
    assert 200 < m["analysed_bytes_per_post"] < 5000
    assert m["lzma_ratio"] > 2 and m["lzma_decode_mb_per_s"] > 1
