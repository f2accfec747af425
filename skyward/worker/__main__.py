from skyward.worker.agent import main

if __name__ == "__main__":
    raise SystemExit(main())
