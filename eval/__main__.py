from eval.cli import app

app()
