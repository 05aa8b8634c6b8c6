from crewwork.cli.main import run

run()
