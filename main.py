"""Train a classifier with PAT or a baseline (`patjax.main`; installed: `patjax-train`).

python main.py --config=configs/pat_cifar10.py --workdir=runs/pat_c10
python main.py --config=configs/quickstart.py --workdir=runs/quickstart
"""

from patjax.main import cli

if __name__ == "__main__":
    cli()
